"""Exec a training launcher that dies with the agent (Linux PR_SET_PDEATHSIG).

    python -m whetstone.trainer_agent.adapters.pdeathsig AGENT_PID -- ARGV...

A separate exec step rather than a `preexec_fn`: the agent has threads (S3 transfers), and
running Python between fork and exec in a threaded process can deadlock. The death signal
survives execve, so the launcher is SIGKILLed the moment the agent is (node loss); the
restarted agent reports the segment preempted from its last durable checkpoint."""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: pdeathsig AGENT_PID -- ARGV...\n")
        raise SystemExit(2)
    agent_pid, command = int(argv[0]), argv[2:]
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the restarted agent kills orphans by pid instead
        pass
    if os.getppid() != agent_pid:  # the agent died before prctl took effect
        raise SystemExit(137)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
