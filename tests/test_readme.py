"""The README's Usage runs offline as written: its Python blocks, in order, in a fresh namespace, with no data
folder (every data set it uses is generated)."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def usage_blocks() -> list[str]:
    text = README.read_text()
    usage = text[text.index("## Usage"):]
    usage = usage[:usage.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", usage, flags=re.S)


def test_the_usage_section_runs_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("GPSCALE_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # it saves a model file
    blocks = usage_blocks()
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block.replace("GPRegressor()", "GPRegressor(progress=False)")
                     .replace("GPClassifier()", "GPClassifier(progress=False)"), str(README), "exec"), namespace)
    assert namespace["reg"].method_ == "sgpr" and namespace["draws"].shape == (100, 5)
    assert (tmp_path / "friedman.gps").exists() and namespace["clf"].method_ == "svgp"
