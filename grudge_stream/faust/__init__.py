"""The Faust glue: agents, checkpoints hooks, health and metrics pages (grudge_stream.faust.app)."""
