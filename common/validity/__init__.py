"""Input validity for secure aggregation: the field, XOF, range circuit, FLP and sharing.

Issue 32, design (a) of docs/bounded-influence.md: the prime field, the XOF, the range circuit,
its fully linear proof and the two-aggregator sharing. Not yet wired into any protocol."""
