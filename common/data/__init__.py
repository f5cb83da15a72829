"""Data readers and formats: CSV, .npy and Parquet files streamed in chunks, and synthetic data."""
