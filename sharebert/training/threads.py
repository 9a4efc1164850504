"""Torch's thread count for a training run, from what the CPU gives now (``compress``; ``make demo`` runs it).

A fixed count is wrong both ways: beside one busy process on 2 cores, 2 threads trained 149 steps where 1 thread trained
981 in the same time (each OpenMP barrier waits for the thread the scheduler took away), and on a quiet machine 1 thread
leaves a core idle. So the count is measured where it matters, on the student's own step (forward and backward on a
batch of the shape training draws): at 1 thread and at each doubling up to the CPUs this process may run on
(``os.sched_getaffinity``), the fastest taken (:func:`choose`). The load changes while a run trains, so
:class:`FitThreads` times the current count on that batch every :data:`PERIOD` seconds of training and measures every
count again when its step got :data:`SHIFT` times slower or faster (two steps in a row: one step's time moves by half
on a loaded machine), or the cores the load average leaves free moved by :data:`LOAD_SHIFT` since the choice (a busy
process came or went; a load of 14 or 13 on 2 cores leaves none either way).

``OMP_NUM_THREADS`` set (the tests set 1): the user's count, kept; nothing is measured. On a GPU nothing is measured.
"""

from __future__ import annotations

import math
import os
import time

from transformers import TrainerCallback

# A larger count is taken only when its step takes less than TIE of the best smaller count's: a few percent is within
# a loaded machine's noise, and each extra thread is a core taken from the machine's other processes.
TIE = 0.9
SHIFT = 1.5  # the current count's step this many times slower (or faster) than when chosen: measure every count again
PERIOD = 30.0  # seconds of training between two checks of the current count (a check: one step on the fixed batch)
# doubled after each re-measure that kept the count: on the loaded box the step moved 0.6-1.7x every minute with the
# machine's speed, and each re-measure costs a step at the other counts (one at 2 threads took 5-8 s there)
CHECKS = 20  # and at least this many of its steps: a check costs at most 1/20 of training on a slow machine
LOAD_SHIFT = 1.0  # the cores the load leaves free (1-minute average) moved by one since the choice: measure again


def user_threads() -> int | None:
    """``OMP_NUM_THREADS`` when it names a positive count (the user's choice, kept), else None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or ``taskset``'s share, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this OS
        return max(1, os.cpu_count() or 1)


def candidates(cpus: int) -> tuple[int, ...]:
    """The counts measured: 1, each doubling below ``cpus``, then ``cpus`` (2 CPUs: 1 and 2; 12: 1, 2, 4, 8, 12)."""
    counts, n = [1], 2
    while n < cpus:
        counts.append(n)
        n *= 2
    return tuple(sorted({*counts, max(1, cpus)}))


def choose(seconds: dict[int, float]) -> int:
    """The count to train with, from the measured seconds of a step at each: the fastest, except that a larger count
    must beat the best smaller one by :data:`TIE` to be taken. Counts whose time is not a finite positive number
    (a failed measure) are skipped; none left: 1."""
    best = None
    for n in sorted(seconds):
        t = seconds[n]
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            continue
        if best is None or t < TIE * seconds[best]:
            best = n
    return best or 1


# A step's forward and backward, times this for the optimizer's update and the head: the plan's own measure
# (``distill_embedding._step_seconds``), so the step measured here can size the plan.
UPDATE_SHARE = 1.3


def step_seconds(model, batch: dict, threads: int, warm: bool = False, give_up: float = math.inf) -> float:
    """Seconds of one training step of ``model`` on ``batch`` at ``threads`` torch threads: the mean of 2 steps after
    an untimed one that pays a new count's one-time costs (``warm``: the count is the one training runs at, so 1 step,
    untimed none); a first step over ``give_up`` seconds is the answer (a count that collapsed is not timed thrice).
    Torch's random state is kept, so a run's draws do not depend on when it measured."""
    import torch

    rng = torch.get_rng_state()
    torch.set_num_threads(threads)
    model.train()
    times = []
    try:
        for _ in range(1 if warm else 3):
            start = time.monotonic()
            _trained_output(model(**batch)).float().pow(2).mean().backward()
            times.append(UPDATE_SHARE * (time.monotonic() - start))
            if times[0] > give_up:
                break
    finally:
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
    timed = times[1:] or times
    return sum(timed) / len(timed)


def _trained_output(output):
    """What a step's backward starts from: a backbone's ``last_hidden_state``, a classifier's ``logits`` (a classifier
    has no ``last_hidden_state``: a task phase's student timed as a backbone failed with an internal error)."""
    hidden = getattr(output, "last_hidden_state", None)
    return hidden if hidden is not None else output.logits


def measure(model, batch: dict, counts, known: dict | None = None, timer=None) -> dict[int, float]:
    """Seconds of a step at each of ``counts`` threads (``timer``, default :func:`step_seconds`), fewest first; a count
    whose first step already takes twice the best so far is given up after it; ``known``: counts measured already."""
    seconds, timer = dict(known or {}), timer or step_seconds
    for n in counts:
        if n not in seconds:
            seconds[n] = timer(model, batch, n, give_up=2 * min(seconds.values(), default=math.inf))
    return seconds


def describe(seconds: dict[int, float], chosen: int) -> str:
    """The measures and the choice, in words."""
    each = ", ".join(f"{t:.3f} s at {n}" for n, t in sorted(seconds.items()))
    return f"{chosen} thread{'s' if chosen > 1 else ''} (a training step {each}; {usable_cpus()} CPUs usable)"


def fit_threads(model, batch: dict, say=print, cpus: int | None = None) -> FitThreads | None:
    """Measure ``model``'s step on ``batch`` at each candidate count, set torch to the chosen one and say so; returns
    the :class:`FitThreads` callback that keeps the choice fitting while training runs. None (nothing measured, torch's
    count unchanged) where ``OMP_NUM_THREADS`` says the user's count or the model trains on a GPU."""
    import torch

    if user_threads() is not None or next(model.parameters()).device.type != "cpu":
        return None
    counts = candidates(usable_cpus() if cpus is None else cpus)
    seconds = measure(model, batch, counts)
    chosen = choose(seconds)
    torch.set_num_threads(chosen)
    say(f"threads: {describe(seconds, chosen)}")
    return FitThreads(batch, counts, seconds, chosen, say)


def training_batch(tok, sentences: list[str], batch: int, seq_len: int, vocab_size: int) -> dict:
    """``batch`` of ``sentences`` spread over the list, padded as a training batch is (the plan times its step on the
    same spread); ids past a cut vocabulary's ``vocab_size`` rows wrapped into it: a step's cost is its shape's."""
    spread = sentences[:: max(1, len(sentences) // batch)][:batch]
    enc = dict(tok(spread, truncation=True, max_length=seq_len, padding=True, return_tensors="pt"))
    enc["input_ids"] = enc["input_ids"] % vocab_size
    return enc


def fit_student_threads(  # 7: compress's plan passes what it knows; training/ may not import pipelines.run's objects
    overrides: dict, vocab_size: int, tok, sentences: list[str], batch: int, seq_len: int, say=print
) -> FitThreads | None:
    """:func:`fit_threads` on a fresh student of the run's shape (``sharebert-tiny`` with ``overrides``: its step costs
    what the trained one's will) and a :func:`training_batch`; None, building nothing, where the user named a count."""
    if user_threads() is not None:
        return None
    from .distill_embedding_setup import build_student

    model = build_student("sharebert-tiny", overrides, vocab_size)
    return fit_threads(model, training_batch(tok, sentences, batch, seq_len, vocab_size), say)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


class FitThreads(TrainerCallback):
    """Keeps torch's thread count fitting the machine while training runs (module docstring): every :data:`PERIOD`
    seconds (and :data:`CHECKS` steps' time) it times one step of the current count on the fixed ``batch``; when that
    moved by :data:`SHIFT` either way or the load average by :data:`LOAD_SHIFT` since the last choice, it measures
    every count again and sets the fastest, said in one line (a step outside :data:`SHIFT` is timed once more, and
    both must be). ``changes``: ``(step, count)`` for each change of
    count. ``clock``, ``load`` and ``timer`` (:func:`step_seconds`'s signature) are the tests' seams."""

    # 8: what fit_threads measured and where to say it, then the tests' seams (clock, load, timer)
    def __init__(self, batch, counts, seconds, chosen, say=print, clock=time.monotonic, load=_load, timer=None):
        self.batch, self.counts, self.say = batch, tuple(counts), say
        self.cpus, self.period = max(self.counts), PERIOD
        self.clock, self.load, self.timer = clock, load, timer or step_seconds
        self.changes = []
        self._chose(seconds, chosen)

    def _chose(self, seconds: dict, chosen: int) -> None:
        self.threads, self.reference = chosen, seconds[chosen]
        self.spare_at_choice, self.checked = self._spare(), self.clock()

    def _spare(self) -> float:
        """The cores the load average leaves free, of :attr:`cpus` (training's own threads count in the load)."""
        return min(float(self.cpus), max(0.0, self.cpus - self.load()))

    def _moved(self, now: float) -> bool:
        return now > SHIFT * self.reference or now * SHIFT < self.reference

    def on_train_begin(self, args, state, control, **kwargs):
        self.checked = self.clock()  # the count was chosen before the teacher's export and pass: a period from now

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is None or self.clock() - self.checked < max(self.period, CHECKS * self.reference):
            return
        self.checked = self.clock()
        now = self.timer(model, self.batch, self.threads, warm=True)
        shifted = self._moved(now)
        if shifted:  # one step's time is noisy on a loaded machine: a second one must agree
            again = self.timer(model, self.batch, self.threads, warm=True)
            shifted = self._moved(again) and (again > self.reference) == (now > self.reference)
            now = (now + again) / 2
        moved = abs(self._spare() - self.spare_at_choice) >= LOAD_SHIFT
        if not (shifted or moved):
            return
        import torch

        seconds = measure(model, self.batch, self.counts, {self.threads: now}, self.timer)
        chosen = choose(seconds)
        why = f"the load moved to {self.load():.1f}" if moved else f"steps took {now / self.reference:.1f}x as long"
        if chosen != self.threads:
            self.changes.append((state.global_step, chosen))
        self.period = PERIOD if chosen != self.threads else 2 * self.period
        self.say(f"threads at step {state.global_step} ({why}): {describe(seconds, chosen)}")
        torch.set_num_threads(chosen)
        self._chose(seconds, chosen)
