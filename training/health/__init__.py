"""Health rules shared by the rank and the core: the records and heartbeat a rank writes, the verdict and
liveness rules both sides judge them by, progress beats and store-operation timing. No torch, no Airflow."""
