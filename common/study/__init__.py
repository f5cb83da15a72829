"""The study contract: study and round specs, their fields, payload encoding and round-0/refinement rounds."""
