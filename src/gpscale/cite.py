"""What to cite when you use a method: ``gpscale.cite("softki")`` gives the BibTeX of the paper behind it.

Each method is cited by the paper that defines it; a method built on another's construction (the convolutional
HVGP on the convolutional GP, VFF-SVGP on VFF and SVGP) cites both. gpscale itself is cited by its
``CITATION.cff``.
"""
from __future__ import annotations

__all__ = ["cite", "REFERENCES"]

# BibTeX entries by key, each a paper's full reference
REFERENCES: dict[str, str] = {
    "camano2024softki": """@article{camano2024softki,
  title   = {High-Dimensional {G}aussian Process Regression with Soft Kernel Interpolation},
  author  = {Cama{\\~n}o, Chris and Huang, Daniel},
  journal = {arXiv preprint arXiv:2410.21419},
  year    = {2024}
}""",
    "evans2018grief": """@inproceedings{evans2018grief,
  title     = {Scalable {G}aussian Processes with Grid-Structured Eigenfunctions ({GP-GRIEF})},
  author    = {Evans, Trefor W. and Nair, Prasanth B.},
  booktitle = {Proceedings of the 35th International Conference on Machine Learning (ICML)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {80},
  pages     = {1417--1426},
  year      = {2018}
}""",
    "zhu2025dbk": """@article{zhu2025dbk,
  title   = {Scalable {G}aussian Processes with Low-Rank Deep Kernel Decomposition},
  author  = {Zhu, Yunqin and Yuchi, Henry Shaowu and Xie, Yao},
  journal = {arXiv preprint arXiv:2505.18526},
  year    = {2025},
  note    = {version 1}
}""",
    "sun2021hkd": """@inproceedings{sun2021hkd,
  title     = {Scalable Variational {G}aussian Processes via Harmonic Kernel Decomposition},
  author    = {Sun, Shengyang and Shi, Jiaxin and Wilson, Andrew Gordon and Grosse, Roger},
  booktitle = {Proceedings of the 38th International Conference on Machine Learning (ICML)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {139},
  pages     = {9955--9965},
  year      = {2021}
}""",
    "azzimonti2020odvff": """@article{azzimonti2020odvff,
  title   = {Orthogonally Decoupled Variational {F}ourier Features},
  author  = {Azzimonti, Dario and Sch{\\"u}rch, Manuel and Benavoli, Alessio and Zaffalon, Marco},
  journal = {arXiv preprint arXiv:2007.06363},
  year    = {2020}
}""",
    "hensman2018vff": """@article{hensman2018vff,
  title   = {Variational {F}ourier Features for {G}aussian Processes},
  author  = {Hensman, James and Durrande, Nicolas and Solin, Arno},
  journal = {Journal of Machine Learning Research},
  volume  = {18},
  number  = {151},
  pages   = {1--52},
  year    = {2018}
}""",
    "salimbeni2018odvgp": """@inproceedings{salimbeni2018odvgp,
  title     = {Orthogonally Decoupled Variational {G}aussian Processes},
  author    = {Salimbeni, Hugh and Cheng, Ching-An and Boots, Byron and Deisenroth, Marc},
  booktitle = {Advances in Neural Information Processing Systems 31 (NeurIPS)},
  year      = {2018}
}""",
    "vanderwilk2017conv": """@inproceedings{vanderwilk2017conv,
  title     = {Convolutional {G}aussian Processes},
  author    = {van der Wilk, Mark and Rasmussen, Carl Edward and Hensman, James},
  booktitle = {Advances in Neural Information Processing Systems 30 (NIPS)},
  year      = {2017}
}""",
    "hensman2013svgp": """@inproceedings{hensman2013svgp,
  title     = {{G}aussian Processes for Big Data},
  author    = {Hensman, James and Fusi, Nicol{\\`o} and Lawrence, Neil D.},
  booktitle = {Proceedings of the 29th Conference on Uncertainty in Artificial Intelligence (UAI)},
  pages     = {282--290},
  year      = {2013}
}""",
    "hensman2015svgp": """@inproceedings{hensman2015svgp,
  title     = {Scalable Variational {G}aussian Process Classification},
  author    = {Hensman, James and Matthews, Alexander G. de G. and Ghahramani, Zoubin},
  booktitle = {Proceedings of the 18th International Conference on Artificial Intelligence and Statistics
               (AISTATS)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {38},
  pages     = {351--360},
  year      = {2015}
}""",
    "titsias2009sgpr": """@inproceedings{titsias2009sgpr,
  title     = {Variational Learning of Inducing Variables in Sparse {G}aussian Processes},
  author    = {Titsias, Michalis K.},
  booktitle = {Proceedings of the 12th International Conference on Artificial Intelligence and Statistics
               (AISTATS)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {5},
  pages     = {567--574},
  year      = {2009}
}""",
    "rasmussen2006gpml": """@book{rasmussen2006gpml,
  title     = {{G}aussian Processes for Machine Learning},
  author    = {Rasmussen, Carl Edward and Williams, Christopher K. I.},
  publisher = {MIT Press},
  year      = {2006}
}""",
}

# the papers behind each method, the defining one first
_METHOD_REFERENCES: dict[str, tuple[str, ...]] = {
    "softki": ("camano2024softki",),
    "grief": ("evans2018grief",),
    "grief-i": ("evans2018grief",),
    "dbk": ("zhu2025dbk",),
    "svdbk": ("zhu2025dbk", "hensman2013svgp"),
    "hvgp": ("sun2021hkd",),
    "conv-svgp": ("vanderwilk2017conv",),
    "conv-hvgp": ("sun2021hkd", "vanderwilk2017conv"),
    "deep-conv-hvgp": ("sun2021hkd", "vanderwilk2017conv"),
    "odvff": ("azzimonti2020odvff",),
    "vff": ("hensman2018vff",),
    "vff-svgp": ("hensman2018vff", "hensman2013svgp"),
    "odvgp": ("salimbeni2018odvgp",),
    "svgp": ("hensman2013svgp", "hensman2015svgp"),
    "sgpr": ("titsias2009sgpr",),
    "exact": ("rasmussen2006gpml",),
}


def cite(method: str) -> str:
    """The BibTeX of the papers behind ``method`` (a method key of ``GPRegressor``, e.g. ``"softki"``), the
    defining paper first, entries separated by a blank line.

    >>> print(cite("sgpr").splitlines()[0])
    @inproceedings{titsias2009sgpr,
    """
    if method not in _METHOD_REFERENCES:
        raise ValueError(f"cite: unknown method {method!r}; the methods with a reference are "
                         f"{', '.join(sorted(_METHOD_REFERENCES))}.")
    return "\n\n".join(REFERENCES[key] for key in _METHOD_REFERENCES[method])
