"""The link: TLS, coordinator addresses, Ed25519 signing and signed device reads."""
