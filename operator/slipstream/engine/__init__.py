"""What the operator knows of the patched SGLang engine: its launch arguments (`args`), its
admin HTTP API (`admin`) and the names of its metrics (`metrics`). Never imports sglang."""
