"""Generated protobuf and gRPC code for ``proto/fedsketch.proto`` (do not edit; ``make proto``)."""
