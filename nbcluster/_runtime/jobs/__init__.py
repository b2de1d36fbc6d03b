"""Jobs: the supervisor process, the job state machine and the head's typed client."""
