"""fedsketch.server: the coordinator side: CL-OMPR decoding, evaluation and the ``fedsketch`` CLI."""
