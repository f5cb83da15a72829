"""Input validity for secure aggregation: the prime field and the range proof's circuit.

Issue 32, design (a) of docs/bounded-influence.md; not yet wired into any protocol."""
