"""bytesched.tuning: rank 0 tunes partition and credit sizes by Bayesian optimisation (paper §4.3).

- :mod:`.space`: the log-scaled (partition, credit) lattice of each architecture;
- :mod:`.measure`: a trial's throughput over a window of steps, robust to outliers;
- :mod:`.search`: scikit-optimize's Gaussian process with Expected Improvement, and the stop rule;
- :mod:`.tuner`: rank 0's trial schedule and decisions (pure: no transport);
- :mod:`.protocol` and :mod:`.session`: the switch broadcast over the rank-0 channel, applied by
  every rank at the same step whatever the timing;
- :mod:`.log`: the CSV tuning log and loading a previous job's best;
- :mod:`.predicted_points`: the simulator's predictions as first points;
- the search-cost study of the paper's Figure 14 lives outside the package: ``python -m benchmarks tuning``.

A plugin needs only :func:`make_session` and :meth:`TuningSession.on_step` (see
:mod:`.session`); nothing here imports a framework, and scikit-learn is imported only when
tuning is switched on.
"""

from .protocol import TuningProtocolError
from .session import TuningSession, make_session

__all__ = ["TuningSession", "make_session", "TuningProtocolError"]
