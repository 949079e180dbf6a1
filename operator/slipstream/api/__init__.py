"""The ServingDeployment API: pydantic models (the one source of field names) and the CRD
generated from them (`python -m slipstream.api.crdgen`)."""
