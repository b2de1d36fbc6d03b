"""Jobs: run a command on a cluster, with its code and dependencies, and follow it.

``JobSubmissionClient(address).submit_job(entrypoint="python train.py",
runtime_env={"working_dir": "."})`` ships the current folder, runs the command on the
cluster as a driver of it, and returns a submission id to follow with ``get_job_status``,
``tail_job_logs`` and friends. The same from a shell: ``nbcluster job submit``.
"""

from nbcluster.job_submission._client import JobSubmissionClient
from nbcluster.job_submission._models import DriverInfo, JobDetails, JobInfo, JobStatus, JobType

__all__ = ["DriverInfo", "JobDetails", "JobInfo", "JobStatus", "JobSubmissionClient", "JobType"]
