"""Every mistake a user of the command line can make, one row each: the command, and words its one-line error must
hold. Every row exits with status 2, prints exactly one line starting ``gpscale: error:`` (no traceback) and writes
nothing: no model, no prediction file, no checkpoint, no folder."""
import csv
import re

import numpy as np
import pytest
import torch

from gpscale.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A folder with a training CSV, a labelled one and the files the rows below need."""
    folder = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 3))
    y = np.sin(5 * X[:, 0]) + X[:, 1]
    with open(folder / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "target"])
        w.writerows(np.c_[X, y].tolist())
    with open(folder / "missing_label.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "label"])
        w.writerows([[*x, "" if i == 5 else "yes" if v > 0.5 else "no"] for i, (x, v) in enumerate(zip(X.tolist(), y))])
    (folder / "one_class.csv").write_text("a,label\n" + "".join(f"{v},yes\n" for v in X[:, 0]))
    (folder / "text_cell.csv").write_text("a,y\n1,2\nx,3\n4,5\n")
    (folder / "ragged.csv").write_text("a,b,y\n1,2,3\n4,5\n6,7,8\n")
    (folder / "header_only.csv").write_text("a,b,y\n")
    (folder / "two_columns.csv").write_text("a,b\n1,2\n3,4\n")
    assert main(["fit", str(folder / "train.csv"), "--target", "target", "--method", "exact", "--epochs", "2",
                 "--quiet", "-o", str(folder / "model.gps")]) == 0
    return folder


ROWS = [
    ("target not a column", ["fit", "{train}", "--target", "nope", "-o", "{out}/m.gps"], "no column 'nope'"),
    ("missing CSV", ["fit", "{dir}/missing.csv", "--target", "y", "-o", "{out}/m.gps"], "No such file"),
    ("unknown method", ["fit", "{train}", "--target", "target", "--method", "magic", "-o", "{out}/m.gps"],
     "Unknown method 'magic'"),
    ("unknown option", ["fit", "{train}", "--target", "target", "-o", "{out}/m.gps", "--option", "bogus=1"],
     "no option 'bogus'"),
    ("option without a value", ["fit", "{train}", "--target", "target", "-o", "{out}/m.gps", "--option", "novalue"],
     "KEY=VALUE"),
    ("option with a bad boolean", ["fit", "{train}", "--target", "target", "-o", "{out}/m.gps", "--option",
                                   "ard=maybe"], "--option ard=maybe: ard is true or false"),
    ("n-inducing below 1", ["fit", "{train}", "--target", "target", "--method", "svgp", "--n-inducing", "-5", "-o",
                            "{out}/m.gps"], "n_inducing .* must be an integer >= 1, got -5"),
    ("negative lr", ["fit", "{train}", "--target", "target", "--lr", "-1", "-o", "{out}/m.gps"],
     "lr .* must be a number > 0, got -1.0"),
    ("no CUDA", ["fit", "{train}", "--target", "target", "--device", "cuda", "-o", "{out}/m.gps"],
     "device='cuda', but this machine has no CUDA device"),
    ("resume without a checkpoint", ["fit", "{train}", "--target", "target", "--resume", "-o", "{out}/m.gps"],
     "pass checkpoint=PATH \\(--checkpoint PATH on the command line\\) too"),
    ("checkpoint in a missing folder", ["fit", "{train}", "--target", "target", "--method", "svgp", "--checkpoint",
                                        "{out}/no/state.pt", "-o", "{out}/m.gps"], "the folder .*no does not exist"),
    ("output in a missing folder", ["fit", "{train}", "--target", "target", "-o", "{out}/no/m.gps"],
     "the folder .*no does not exist"),
    ("a missing class label", ["fit", "{dir}/missing_label.csv", "--target", "label", "--classify", "-o",
                               "{out}/m.gps"], "line 7, column 'label': the class label is missing"),
    ("one class", ["fit", "{dir}/one_class.csv", "--target", "label", "--classify", "-o", "{out}/m.gps"],
     "one class only"),
    ("text in a numeric cell", ["fit", "{dir}/text_cell.csv", "--target", "y", "-o", "{out}/m.gps"], "line 3"),
    ("a short row", ["fit", "{dir}/ragged.csv", "--target", "y", "-o", "{out}/m.gps"], "line 3"),
    ("a header and no rows", ["fit", "{dir}/header_only.csv", "--target", "y", "-o", "{out}/m.gps"],
     "needs a header row and at least one data row"),
    ("not a model file", ["predict", "{train}", "{train}", "-o", "{out}/p.csv"], "not a gpscale model file"),
    ("a missing model file", ["predict", "{dir}/nope.gps", "{train}", "-o", "{out}/p.csv"], "no such model file"),
    ("inputs without the model's columns", ["predict", "{dir}/model.gps", "{dir}/two_columns.csv", "-o",
                                            "{out}/p.csv"], "two_columns.csv lacks the columns c; its columns: a, b"),
    ("predictions into a missing folder", ["predict", "{dir}/model.gps", "{train}", "-o", "{out}/no/p.csv"],
     "the folder .*no does not exist"),
    ("unknown protocol", ["bench", "--protocol", "nope", "--out", "{out}/bench"], "nope"),
    ("report of a missing store", ["report", "{dir}/missing.sqlite", "-o", "{out}/report"],
     "missing.sqlite: no such results file"),
    ("step time of a full-batch method", ["step-time", "sgpr", "--d", "2"], "trains full batch"),
]
if torch.cuda.is_available():
    ROWS = [row for row in ROWS if row[0] != "no CUDA"]


def test_the_table_has_a_row_for_every_kind_of_mistake():
    assert len(ROWS) >= 20 and len({row[0] for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("args, message", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_a_mistake_is_one_line_exit_2_and_writes_nothing(files, tmp_path, capsys, args, message):
    argv = [a.format(train=files / "train.csv", dir=files, out=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpscale: error:") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert list(tmp_path.iterdir()) == []
