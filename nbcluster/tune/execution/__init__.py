"""How an experiment runs: the controller (decisions), runners (trial hosts), storage, driver."""
