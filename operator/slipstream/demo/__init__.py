"""The live closed-loop demo (``make demo``) and the traffic phases it shares with the
closed-loop test: uniform, then heterogeneous, then uniform again."""
