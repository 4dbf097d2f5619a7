"""What a rank (tbcoll.observability.dumps) and tbrun (tbcoll.launch.postmortem, .timeline,
.supervisor) agree on for dumps and traces: the store's keys and the signal. Apart from
tbcoll.observability.dumps so that tbrun reads them without importing the library's collectives
(numpy)."""

import signal

DUMP_KEY = "tbrun/dump/{}"  # rank -> its latest dump (JSON)
LISTENING_KEY = "tbrun/dump-listening/{}"  # rank -> set once the rank answers requests
REQUEST_KEY = "tbrun/dump-request/{}"  # n -> why tbrun asks, for n = 1, 2, ...
ANSWER_KEY = "tbrun/dump-answer/{}/{}"  # (n, rank) -> set once the rank answered request n
# (rank, n) -> the rank's n-th chunk of calls (JSON), under tbrun --trace; tbrun's store hands
# every key under TRACE_PREFIX to its spool (tbcoll.launch.timeline) rather than keep it
TRACE_PREFIX = "tbrun/trace/"
TRACE_KEY = TRACE_PREFIX + "{}/{}"
STACKS_SIGNAL = signal.SIGUSR2  # write every thread's stack to stderr (tbcoll.observability.dumps)
