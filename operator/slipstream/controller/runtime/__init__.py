"""The operator process: its entry point (`main`) and its memory settings (`malloc`)."""
