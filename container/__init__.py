"""The worker process: umbilical client, operator runtime, buffer server, Spark bridge."""
