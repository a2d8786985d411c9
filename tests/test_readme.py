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
    assert len(blocks) >= 3 and "GPRegressor()" in blocks[0] and "GPClassifier(n_inducing=64)" in blocks[2]
    namespace: dict = {}
    for block in blocks:
        # the README's calls with smaller budgets (the exact GP's evidence of 1,000 rows, at most 40 L-BFGS and 300
        # Adam steps): the same code in a fraction of the time
        block = block.replace("GPRegressor()", "GPRegressor(progress=False, evidence_rows=1000, max_steps=40)")
        block = block.replace("GPClassifier(n_inducing=64)",
                              "GPClassifier(n_inducing=64, max_steps=300, progress=False)")
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["reg"].method_ == "exact" and namespace["draws"].shape == (100, 5)
    assert (tmp_path / "friedman.gps").exists() and namespace["clf"].method_ == "svgp"
