"""The job's entrypoint: replace with your own. NBCLUSTER_ADDRESS and NBCLUSTER_TOKEN_FILE
(set in job.yaml) make nbcluster.init() connect to the cluster through its head."""

import nbcluster
from nbcluster.autoscaler.sdk import request_resources

nbcluster.init()
request_resources(num_cpus=8)  # ask for room before a burst (optional)


@nbcluster.remote
def square(x: int) -> int:
    return x * x


print("sum of squares:", sum(nbcluster.get([square.remote(i) for i in range(1000)])))
request_resources(num_cpus=0)
nbcluster.shutdown()
