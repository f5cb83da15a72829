"""Input validity for secure aggregation: the field, XOF, range circuit, FLP and sharing.

Issue 32, design (a) of docs/bounded-influence.md: the prime field, the XOF, the range circuit,
its fully linear proof, the two-aggregator sharing and its wire format. A secure study with
``validation: "helper"`` uses them (fedsketch.common.study.validated, client/validated_steps.py,
server/helper/, server/service/validated_round.py)."""
