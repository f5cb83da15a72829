"""The multi-device simulator: a real coordinator and real devices on loopback gRPC with TLS."""
