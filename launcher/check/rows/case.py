"""What a check row reads and writes: `Case` (one gathered value and the plan's own figures for
it: the memory need, vLLM's startup guard, the KV pool; each rank's fabric assessment once) and
`RankReport` (one rank's rows, where a row adds its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import SparkstackError
from ...facts import fabric
from ...gather.value import Gathered
from ...inputs import vllm_guard
from ...plan import cluster_plan as planning
from ...plan.cluster_plan import MemoryNeed, memory_guard, rank_memory
from ...status import Finding, Status


@dataclass
class RankReport:
    rank: int
    host: str
    checks: list[Finding] = field(default_factory=list)

    def add(self, name: str, status: Status, value: str, fix: str = "") -> None:
        self.checks.append(Finding(name, status, value, fix if status != Status.PASS else ""))


_NOT_YET = object()


class Case:
    """What the rows read while judging one gathered value: the value itself, the plan's own
    figures (the memory need, vLLM's startup guard, the KV pool), each rank's fabric assessment,
    once. The figures are the plan's: `plan` as the caller made it from this value (`up`), else
    made here once; a plan that refuses (a rank nothing clears, no KV pool that fits) has none to
    give, and its guard and pool are then reckoned as it reckoned them before refusing."""

    def __init__(self, gathered: Gathered, plan: planning.Plan | None = None):
        self.gathered = gathered
        self._plan = _NOT_YET if plan is None else plan
        self.loaded = gathered.loaded
        self.facts = gathered.facts
        self.image, self.image_error = gathered.known_image, gathered.image_error
        self.local_image_id = gathered.local_image_id
        self.targets, self.extras, self.staged = gathered.targets, gathered.extras, gathered.staged
        self.api_key = gathered.key
        self.need: MemoryNeed | None = None
        self.need_error = gathered.model_error  # why the memory need could not be computed
        if gathered.model is not None:
            try:
                self.need = planning.memory_need(self.loaded, gathered.model)
            except SparkstackError as e:
                self.need_error = e.message
        self._fabrics: dict = {}
        self._guard: vllm_guard.Guard | None = None
        self._kv: object = None  # the plan's KV sizing, or why there is none

    def fabric(self, r: int) -> fabric.RankFabric:
        """The rank's fabric assessment, once (several rows and the MTU comparison use it)."""
        if r not in self._fabrics:
            self._fabrics[r] = fabric.for_rank(self.facts[r], self.loaded.cluster, r)
        return self._fabrics[r]

    @property
    def plan(self) -> planning.Plan | None:
        """The plan made from this gathered value, once; None when it refuses or cannot be made."""
        if self._plan is _NOT_YET:
            self._plan = None
            if self.gathered.model is not None:
                try:
                    self._plan = planning.build(self.loaded, self.gathered)
                except SparkstackError:
                    pass  # the rows say why: the guard's, the pool's or the config's own words
        return self._plan

    def guard(self) -> vllm_guard.Guard:
        """vLLM's startup guard at the utilisation the plan passes (plan.guard), once; raises
        ConfigError for a utilisation that is not a number."""
        if self._guard is None:
            planned = self.plan.guard if self.plan else None
            self._guard = planned or memory_guard(self.loaded, rank_memory(self.loaded, self.facts, []))
        return self._guard

    def kv(self):
        """The KV pool the plan sizes (plan.kv), once; the error's text when it cannot be sized."""
        if self._kv is None:
            if self.plan and self.plan.kv:
                self._kv = self.plan.kv
            else:
                try:
                    self._kv = planning.serving_kv(self.loaded, self.gathered.model,
                                                   rank_memory(self.loaded, self.facts, []))
                except SparkstackError as e:
                    self._kv = e.message
        return self._kv
