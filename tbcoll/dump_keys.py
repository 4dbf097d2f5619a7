"""What a rank (tbcoll.dumps) and tbrun (tbcoll.launch.postmortem, .timeline, .supervisor)
agree on for dumps and traces: the store's keys and the signal. Apart from tbcoll.dumps so that
tbrun reads them without importing the library's collectives (numpy)."""

import signal

DUMP_KEY = "tbrun/dump/{}"  # rank -> its latest dump (JSON)
LISTENING_KEY = "tbrun/dump-listening/{}"  # rank -> set once the rank answers requests
REQUEST_KEY = "tbrun/dump-request/{}"  # n -> why tbrun asks, for n = 1, 2, ...
ANSWER_KEY = "tbrun/dump-answer/{}/{}"  # (n, rank) -> set once the rank answered request n
TRACE_KEY = "tbrun/trace/{}"  # rank -> every call it made (JSON), under tbrun --trace
STACKS_SIGNAL = signal.SIGUSR2  # write every thread's stack to stderr (tbcoll.dumps)
