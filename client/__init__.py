"""fedsketch.client: the device side. Never imports ``fedsketch.server``."""
