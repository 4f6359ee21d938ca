"""The job wing: what every backend whose work outlives its worker shares (Docker containers, Ray and Slurm jobs).

Such a backend submits a job to something that outlives the worker, records its id, follows it, collects its
result, stops it, and reaps it when its worker died. The wing holds each of those decisions once:

- :mod:`.durable`: the job's record in the task instance's task state store (taken over by a later try);
- :mod:`.trigger`: the trigger skeleton a deferred job waits on (one decision loop, a look at the job per poll);
- :mod:`.orphans`: whether a job whose worker died is to be stopped (a durable one only once its task ended);
- ``runtime/reaper.py``: the pinned subreaper a job's entrypoint runs the runtime beneath, on the job's node (a Ray
  job's after its pre-flight, ``ray/reaper.py``).

Not a backend (no registry entry); no client of any engine or cluster.
"""
