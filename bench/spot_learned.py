"""The availability models ``deadline-aware-plan`` plans with (:mod:`bench.spot_plan`).

Fitted by ``bench/spot_model.py`` on the tuning split of the bundled traces (the first 40% of the two tuning dates)
and nothing else; ``tests/test_spot_plan.py`` checks this file against that fit. ``ONE_ZONE``: the stretches of a
job that stays in one zone; ``ANY_ZONE``: of a job that may take any zone of its date (a lost zone is a move to the
zone whose spot has lasted longest, when one has it).
"""

from bench.spot_outlook import Model

ONE_ZONE = Model(
    edges_s=(0.0, 300.0, 600.0, 1200.0, 2400.0, 4800.0, 9600.0, 19200.0, 38400.0, 76800.0),
    up_end_per_h=(0.131575, 2.528239, 1.364915, 0.867636, 0.5878, 0.311216, 0.210965, 0.129562, 0.127385, 0.029191),
    down_end_per_h=(0.318656, 2.217784, 1.297547, 0.809172, 0.539849, 0.231378, 0.302966, 0.171363, 0.156809, 0.055443),
    move_share=0.001224,
)
ANY_ZONE = Model(
    edges_s=(0.0, 300.0, 600.0, 1200.0, 2400.0, 4800.0, 9600.0, 19200.0, 38400.0, 76800.0),
    up_end_per_h=(0.282226, 1.554924, 0.641116, 0.426871, 0.36905, 0.281357, 0.217639, 0.078523, 0.045502, 0.029),
    down_end_per_h=(1.860465, 1.60804, 2.011735, 0.788609, 1.443349, 0.835849, 1.355932, 1.0, 1.0, 1.0),
    move_share=0.721519,
)
