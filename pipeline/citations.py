"""The papers whose methods contramine implements, as BibTeX: one place that the sentence-transformers losses'
`citation` (which SentenceTransformerTrainer writes into a model card), the exported datasets' cards and the
checkpoints' model cards all read. Keyed by objective name (pipeline/config/training.py OBJECTIVE_NAMES)."""
from __future__ import annotations

CITATIONS = {
    "simcse": """@inproceedings{gao-etal-2021-simcse,
    title = "{S}im{CSE}: Simple Contrastive Learning of Sentence Embeddings",
    author = "Gao, Tianyu and Yao, Xingcheng and Chen, Danqi",
    booktitle = "Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing",
    year = "2021",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2021.emnlp-main.552",
    doi = "10.18653/v1/2021.emnlp-main.552",
}""",
    "debcse": """@inproceedings{miao-etal-2023-debcse,
    title = "{D}eb{CSE}: Rethinking Unsupervised Contrastive Sentence Embedding Learning in the Debiasing Perspective",
    author = "Miao, Pu and Du, Zeyao and Zhang, Junlin",
    booktitle = "Proceedings of the 32nd ACM International Conference on Information and Knowledge Management",
    year = "2023",
    publisher = "Association for Computing Machinery",
    url = "https://arxiv.org/abs/2309.07396",
    doi = "10.1145/3583780.3614833",
}""",
    "osscse": """@inproceedings{shi-etal-2023-osscse,
    title = "{O}ss{CSE}: Overcoming Surface Structure Bias in Contrastive Learning for Unsupervised Sentence Embedding",
    author = "Shi, Zhan and Wang, Guoyin and Bai, Ke and Li, Jiwei and Li, Xiang and Cui, Qingjun and Zeng, Belinda and
              Chilimbi, Trishul and Zhu, Xiaodan",
    booktitle = "Proceedings of the 2023 Conference on Empirical Methods in Natural Language Processing",
    year = "2023",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2023.emnlp-main.448",
}""",
    "whitenedcse": """@inproceedings{zhuo-etal-2023-whitenedcse,
    title = "{W}hitened{CSE}: Whitening-based Contrastive Learning of Sentence Embeddings",
    author = "Zhuo, Wenjie and Sun, Yifan and Wang, Xiaohan and Zhu, Linchao and Yang, Yi",
    booktitle = "Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics",
    year = "2023",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2023.acl-long.677",
}""",
    "dclr": """@inproceedings{zhou-etal-2022-debiased,
    title = "Debiased Contrastive Learning of Unsupervised Sentence Representations",
    author = "Zhou, Kun and Zhang, Beichen and Zhao, Xin and Wen, Ji-Rong",
    booktitle = "Proceedings of the 60th Annual Meeting of the Association for Computational Linguistics",
    year = "2022",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.acl-long.423",
}""",
}
# The run's tables -> the papers whose mining method made them: `pairs` is DebCSE's IPW sampling of positives and
# hard negatives, `triplets` OssCSE's back-translated paraphrases and rule negations, `embeddings` (as DCLR reads
# them) the frozen model's vectors of DCLR's instance weighting. `sentences` is the corpus, split: no method.
MINED_BY = {"pairs": ("debcse",), "triplets": ("osscse",), "embeddings": ("dclr",), "sentences": ()}


def bibtex(*names: str) -> str:
    """The BibTeX entries of these objectives' papers, one after another (a blank line between); an objective with
    no entry here (a new one) adds none."""
    return "\n\n".join(CITATIONS[n] for n in dict.fromkeys(names) if n in CITATIONS)
