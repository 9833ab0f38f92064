"""`Config`: every section in one typed object, shared by mining and training (loading: loading.py)."""
from __future__ import annotations

import hashlib
import json

from pydantic import Field, model_validator

from contramine.pipeline.config.backtranslation import BacktranslateCfg
from contramine.pipeline.config.base import Section, result_settings
from contramine.pipeline.config.mining import (DataCfg, EmbeddingsCfg, EncoderCfg, IpwCfg, NegateCfg, NeighboursCfg, NoiseCfg,
                                    ParaphrasesCfg, RunCfg, RunnerCfg, ScoresCfg, SentencesCfg)
from contramine.pipeline.config.training import CompareCfg, MineCfg, TrainCfg


class Config(Section):
    run: RunCfg = RunCfg()
    runner: RunnerCfg = Field(default_factory=RunnerCfg)  # a fresh one: runner.memo_key comes from the environment now
    mine: MineCfg = MineCfg()
    data: DataCfg = DataCfg()
    sentences: SentencesCfg = SentencesCfg()
    encoder: EncoderCfg = EncoderCfg()
    embeddings: EmbeddingsCfg = EmbeddingsCfg()
    neighbours: NeighboursCfg = NeighboursCfg()
    noise: NoiseCfg = NoiseCfg()
    scores: ScoresCfg = ScoresCfg()
    ipw: IpwCfg = IpwCfg()
    backtranslate: BacktranslateCfg = BacktranslateCfg()
    negate: NegateCfg = NegateCfg()
    paraphrases: ParaphrasesCfg = ParaphrasesCfg()
    train: TrainCfg = TrainCfg()
    compare: CompareCfg = CompareCfg()
    profile: str = "default"

    @model_validator(mode="after")
    def _cross(self):
        if self.ipw.m_neg > self.neighbours.pool_size:
            raise ValueError(f"ipw.m_neg ({self.ipw.m_neg}) > neighbours.pool_size ({self.neighbours.pool_size})")
        return self

    def section_hash(self, *sections: str) -> str:
        """Content hash of the named sections: a stage's cache key depends only on what it reads."""
        blob = json.dumps({s: result_settings(getattr(self, s)) for s in sections}, sort_keys=True)
        return hashlib.blake2b(blob.encode(), digest_size=16).hexdigest()
