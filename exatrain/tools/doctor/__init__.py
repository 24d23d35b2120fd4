"""`exatrain doctor`: probes.py holds the per-rank checks and the bandwidth sweep, command.py the command that
starts the group and prints every rank's report."""
