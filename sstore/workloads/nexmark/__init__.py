"""Nexmark, the stream processors' benchmark, as a workload: the event generator
(``generator``) and the queries q0-q8 as sstore dataflows (``queries``). See docs/nexmark.md."""
