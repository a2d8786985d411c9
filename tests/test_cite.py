"""gpscale.cite: a BibTeX reference for every method, each entry well formed."""
import re

import pytest

import gpscale
from gpscale.cite import REFERENCES


def entries(bibtex: str) -> list[str]:
    return re.findall(r"^@\w+\{([\w-]+),", bibtex, flags=re.M)


@pytest.mark.parametrize("method", gpscale.available_methods())
def test_every_method_has_a_reference(method):
    bibtex = gpscale.cite(method)
    keys = entries(bibtex)
    assert keys and all(key in REFERENCES for key in keys)
    for field in ("title", "author", "year"):
        assert bibtex.count(f"  {field}") >= len(keys)


@pytest.mark.parametrize("key", sorted(REFERENCES))
def test_every_entry_is_well_formed(key):
    entry = REFERENCES[key]
    assert entries(entry) == [key]
    assert entry.count("{") == entry.count("}")
    assert re.search(r"year\s*=\s*\{(19|20)\d\d\}", entry)


def test_the_defining_paper_comes_first():
    assert entries(gpscale.cite("conv-hvgp"))[0] == "sun2021hkd"
    assert entries(gpscale.cite("softki")) == ["camano2024softki"]


def test_an_unknown_method_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown method 'softkii'.*softki"):
        gpscale.cite("softkii")
