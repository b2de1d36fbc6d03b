"""``multiprocessing.Pool`` on the cluster (Ray's ``ray.util.multiprocessing``).

Code written for the standard library's pool runs on the cluster by changing its import::

    from nbcluster.util.multiprocessing import Pool

    with Pool() as pool:                      # one process per CPU of the cluster
        print(pool.map(square, range(100)))

``TimeoutError`` and ``JoinableQueue`` are the standard library's, re-exported as Ray does.
"""

from multiprocessing import JoinableQueue, TimeoutError

from nbcluster.util.multiprocessing._results import AsyncResult, IMapIterator
from nbcluster.util.multiprocessing.pool import Pool

__all__ = ["AsyncResult", "IMapIterator", "JoinableQueue", "Pool", "TimeoutError"]
