"""Where data comes from: a dataset of the catalog, or a team's labelled images landed
day by day.

Enters: a dataset name and version (``catalog.py``: tensorflow-datasets, or the offline
``digits.py``), or a team's files landed in the data store as dated partitions
(``landing.py``; ``demo.py`` writes demo days).
Leaves: the tfds builder that staging prepares (``catalog.get_builder``), and a team's
partitions listed and read from the store, their images decoded (``images.Snapshot``),
for ``snapshot/``.
"""
