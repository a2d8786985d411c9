"""The one-answer measurement (experiments.one_answer) at a tiny size: every run is recorded, and SoftKI's two
processes, which evaluate the whole gathered batch (the posterior pass alone sums in another order), give its
one-process predictions to round-off."""
from experiments.one_answer import main


def test_the_record_holds_each_run_and_softkis_two_processes_agree_to_round_off():
    record = main(["--n", "60", "--methods", "softki"])
    assert set(record["methods"]) == {"softki"}
    for runs in record["methods"].values():
        assert runs["smallest_std"] > 0
        assert set(runs) == {"smallest_std", "two processes", "two threads"}
    assert max(record["methods"]["softki"]["two processes"].values()) < 1e-6
