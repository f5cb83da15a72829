"""What a secure-aggregation study assumes about its devices, and what follows (MECHANISMS §4.3).

The operator states, for a roster of L = ``min_devices`` devices, two public numbers:

* D, the devices that may drop out (not register, or go silent at any later stage);
* C, the devices that may collude with the coordinator (they hand it their noise shares and
  every Shamir share they hold). C counts every device the operator controls, including any
  it enrolled itself. Devices take the roster and its keys from the coordinator, so against
  a coordinator that deviates the rules hold only if those keys are the devices' own (the
  package's security scope).

Stated as fractions f_D, f_C of L they are rounded up to whole devices: D = ⌈f_D·L⌉,
C = ⌈f_C·L⌉ (:meth:`Assumptions.from_fractions`). Five rules follow.

1. **Noise: h_min = L − D − C.** Every device adds NB(1/h_min, 1−a) − NB(1/h_min, 1−a) per
   coordinate. The sum is unmasked only over a survivor list of at least L − D masked inputs
   (devices sign no shorter list, and the coordinator aborts below), and at most C of those
   shares are known to the coordinator, so at least h_min unknown shares, which add up to one
   DLap(a) plus independent noise, are in the sum: ε-DP by post-processing. h_min < 1 leaves
   less than one noise draw and is refused.
2. **Privacy of one device: 2t > |N(u)| + 1 + min(C, |N(u)|).** Device u's self-mask seed b_u
   and mask key s_sk_u are each Shamir-shared t-of-n among N⁺(u) = N(u) ∪ {u}. A coordinator
   that lists u as a survivor to u and some neighbours, and as dropped to the other
   neighbours, collects b-shares from the first group (u's own included) and s_sk-shares from
   the second; an honest device reveals one kind per peer (u never reveals its own s_sk), a
   colluder both. With t of each it removes both masks from y_u and reads u's own sum plus
   only 1/h_min of a noise draw. That takes 2t ≤ |N(u)| + 1 + C_u shares, C_u = min(C, |N(u)|)
   the colluders among u's neighbours (in the worst case all of them: the graph's seed is
   public). With C = 0 the rule is a strict majority of N⁺(u): t > (|N(u)| + 1)/2. The
   consistency round (rule 4) already stops such a split, as every device derives both lists
   from one signed survivor list; rule 2 stays as a second defence.
3. **Liveness: t ≤ |N(u)| + 1 − min(D, |N(u)|).** Even when all D dropouts are neighbours of
   u, t holders of u's shares (u among them) remain, so a round that stays within its
   assumptions finishes. More dropouts than D make it fail, releasing nothing.
4. **One survivor list: 2(L − D) > L + C, i.e. L > 2D + C.** Before it reveals a share, a
   device needs q signatures on the survivor list it signed itself (stage 4 of the package
   docstring) from members of a public signing committee of p devices, with 2q > p + C, so
   that two lists cannot both have q (an honest member signs one list), and p − D' ≥ q, so
   that the members left after the D' dropouts still possible can sign
   (:class:`~fedsketch.common.secagg.params.SecAggParams`: p = min(n, 2D' + C + 1)). The list
   is then unique, and a coordinator that deviates learns no sum but Σ over that list, of at
   least L − D inputs. Both need, for the whole roster, 2(L − D) > L + C. Rules 2 and 3
   imply it: with all L registered, 2(|N(u)| + 1 − D) ≥ 2t > |N(u)| + 1 + C, so
   L ≥ |N(u)| + 1 > 2D + C (when C ≤ |N(u)|; otherwise the rules force t = |N(u)| + 1 and
   D = 0, and h_min ≥ 1 gives L > C).
5. **The honest survivors stay connected: |N(u)| > C + D'** (D' = n − (L − D), the dropouts
   left for a roster of n). The pairwise masks of two devices cancel only in their sum, so
   the coordinator learns the sum of every connected group of honest survivors separately:
   the colluders hand it their masks, and a dropped device's mask key is rebuilt. The graph
   of :func:`~fedsketch.common.secagg.params.neighbours` (a Harary graph) stays connected
   after any |N(u)| − 1 devices are removed, so with at most C colluders and D' devices left
   out of the survivor list the honest survivors form one group, and the sum over it carries
   all h_min shares. When all of a device's neighbours collude, the coordinator reads that
   device's own sketch with 1/h_min of the noise, even if it follows the protocol. Rules 2
   and 3 imply this rule except when C ≥ |N(u)|, a sparse graph with D = 0 (they then force
   t = |N(u)| + 1), which this rule refuses. The complete graph is connected after any
   removal.

Rules 2, 3 and 5 are checked for every roster size the round can start with, L − D to L (devices
that never register count among the D), with the neighbourhood sizes of
:func:`fedsketch.common.secagg.params.neighbours`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


def neighbourhood_size(devices: int, degree: int | None) -> int:
    """|N(u)|, the same for every u, in the graph of :func:`~.params.neighbours` on ``devices``
    devices: devices − 1 for the complete graph (degree None or ≥ devices − 1); otherwise
    ``degree``, plus one when degree and devices are both odd (the two opposite devices)."""
    if degree is None or degree >= devices - 1:
        return devices - 1
    return degree + (degree % 2) * (devices % 2)


def split_reach(size: int, colluders: int) -> int:
    """|N(u)| + 1 + min(C, |N(u)|): the shares of u's two secrets, both kinds together, that a
    split of N⁺(u) = N(u) ∪ {u} can hand a coordinator (rule 2: privacy needs 2t above it)."""
    return size + 1 + min(colluders, size)


def fraction_of(fraction: float, devices: int) -> int:
    """⌈fraction·devices⌉ whole devices, for a stated fraction in [0, 1), computed exactly on
    the shortest decimal that names the float (so 0.1 of 100 is 10, not the 11 that the
    binary 0.1000000000000000055… would give, and 1e-10 of 10 is 1)."""
    if not (math.isfinite(fraction) and 0 <= fraction < 1):
        raise ValueError(f"a fraction of the devices must lie in [0, 1), got {fraction}")
    return math.ceil(Fraction(repr(float(fraction))) * devices)


@dataclass(frozen=True)
class Assumptions:
    """L devices in the roster, at most D dropouts and at most C colluders (module docstring)."""

    devices: int
    dropouts: int
    colluders: int

    def __post_init__(self) -> None:
        if self.devices < 1 or self.dropouts < 0 or self.colluders < 0:
            raise ValueError(f"secure aggregation needs L >= 1 devices and D, C >= 0, got "
                             f"L = {self.devices}, D = {self.dropouts}, C = {self.colluders}")
        if self.min_honest < 1:
            raise ValueError(
                f"secure aggregation: with L = {self.devices} devices, D = {self.dropouts} "
                f"dropouts and C = {self.colluders} colluders, h_min = L − D − C = "
                f"{self.min_honest}: the honest devices' noise shares would add up to less than "
                f"one noise draw")

    @classmethod
    def from_fractions(cls, devices: int, max_dropout: float, max_colluders: float) -> Assumptions:
        """D = ⌈max_dropout·L⌉, C = ⌈max_colluders·L⌉ (:func:`fraction_of`)."""
        return cls(devices, fraction_of(max_dropout, devices), fraction_of(max_colluders, devices))

    @property
    def min_honest(self) -> int:
        """h_min = L − D − C: the honest submitters the noise is split over (rule 1)."""
        return self.devices - self.dropouts - self.colluders

    @property
    def min_submitters(self) -> int:
        """L − D: the fewest registered devices, and masked inputs, a round may go on with."""
        return self.devices - self.dropouts

    def rosters(self) -> range:
        """The roster sizes a round can start with: L − D to L."""
        return range(self.min_submitters, self.devices + 1)

    def _sizes(self, degree: int | None) -> list[tuple[int, int]]:
        """(n, |N(u)|) for every roster size n the round can start with."""
        return [(n, neighbourhood_size(n, degree)) for n in self.rosters()]

    def smallest_private_threshold(self, degree: int | None) -> int:
        """The smallest t with 2t > |N(u)| + 1 + min(C, |N(u)|) at every roster size (rule 2)."""
        return max(split_reach(s, self.colluders) // 2 + 1 for _, s in self._sizes(degree))

    def largest_live_threshold(self, degree: int | None) -> int:
        """The largest t that the stated dropouts cannot stall (rule 3): with n registered,
        n − (L − D) dropouts remain for the later stages."""
        return min(s + 1 - min(n - self.min_submitters, s) for n, s in self._sizes(degree))

    def default_threshold(self, degree: int | None) -> int:
        """The smallest private threshold, once :meth:`check` accepts it."""
        t = self.smallest_private_threshold(degree)
        self.check(t, degree)
        return t

    def check(self, threshold: int, degree: int | None) -> None:
        """ValueError, with the rule and the numbers, unless the assumptions satisfy rule 5
        and ``threshold`` rules 2 and 3 for ``degree`` (None: the complete graph); rule 4 then
        holds as well."""
        for n, size in self._sizes(degree):
            left = n - self.min_submitters
            if size < n - 1 and size <= self.colluders + left:
                raise ValueError(
                    f"secure aggregation: a graph of degree {degree} gives each device "
                    f"{size} neighbours, no more than the C = {self.colluders} colluders and "
                    f"{left} dropouts assumed: a device whose neighbours all collude or drop "
                    f"would be unmasked alone; the degree must exceed C + D = "
                    f"{self.colluders + left}")
        low, high = self.smallest_private_threshold(degree), self.largest_live_threshold(degree)
        graph = "the complete graph" if degree is None else f"a graph of degree {degree}"
        if low > high:
            raise ValueError(
                f"secure aggregation: no threshold fits {graph} with D = {self.dropouts} dropouts "
                f"and C = {self.colluders} colluders of L = {self.devices}: privacy needs t >= "
                f"{low} (2t > |N(u)| + 1 + colluders among u's neighbours), finishing despite the "
                f"dropouts needs t <= {high}; assume fewer dropouts or colluders"
                + ("" if degree is None else ", or use a larger degree"))
        if threshold < low:
            raise ValueError(
                f"secure aggregation: threshold {threshold} is too low for {graph} with "
                f"C = {self.colluders} colluders: a coordinator could collect both kinds of "
                f"share of one device from disjoint halves of its neighbourhood and unmask it "
                f"alone; t must be >= {low}")
        if threshold > high:
            raise ValueError(
                f"secure aggregation: threshold {threshold} is too high for {graph} with "
                f"D = {self.dropouts} dropouts of L = {self.devices}: the round could stall "
                f"after devices have spent; t must be <= {high}")
