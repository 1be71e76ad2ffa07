"""Spark for both drivers of the window engine: one long-lived session per process, the
window input written for Spark as it arrives, results back as Arrow."""
