"""The mining stages, one module each: its computation (pure functions over Arrow tables) and, next to it, its
declaration (`@stage(...)` from pipeline/engine/spec.py: what it reads, writes, which settings and facts change it).

Every module of this package is a stage (and so is every module of a plugin package appended to
pipeline/engine/discovery.py's PACKAGES). The run order is derived from what they read and write
(pipeline/engine/discovery.py: each stage after the stages whose tables it reads; ties in declaration order, the
packages in turn and each one's modules by name). Adding a stage: a new module here with one `@stage` function,
then `python -m contramine.flows.deployments > prefect.yaml`.
"""
