"""What runs operators, shared by both drivers of the window engine (the container's
runner and the local test runner): the engine itself, how a batch reaches ``process``,
watermarks, and what of an operator is state."""
