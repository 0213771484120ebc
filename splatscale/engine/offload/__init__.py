"""GS-Scale's offloaded rows: the Gaussians and their optimiser state in host memory
(``rows``), culling on the device from lagging geometry (``culling``), a host Adam
that defers untouched rows (``host_adam``), the host update overlapping the next
step (``forwarding``), the next step's rows sent early (``lookahead``), and the
copies between host and device (``transfers``)."""
