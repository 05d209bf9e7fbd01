"""The dashboard: the page a browser opens on any node (``GET /``), its data and its history.

``routes.py`` installs the routes and their read-only access (``install``), ``cluster.py`` the
members' figures and exchange graph, ``history.py`` the ring of recent status samples behind the
charts, ``static/`` the page itself (plain JavaScript and SVG, no library). Torch-free, like the
rest of the daemon.
"""
