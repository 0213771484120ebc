"""gsplat 1.5.3's rasterisation conventions, shared by every backend.

They differ slightly from the original 3DGS CUDA rasteriser: the near plane
is 0.01 (not 0.2), the screen-space box is per axis and opacity-aware, the
principal point is the camera's own (not the image centre), and a pixel's
centre is at (i + 0.5, j + 0.5).
"""

TILE_SIZE = 16
FRUSTUM_CLAMP = 1.3     # camera-space x/y clamped to 1.3x the frustum before the Jacobian
EPS2D = 0.3             # added to the 2D covariance's diagonal
NEAR_PLANE = 0.01
FAR_PLANE = 1e10
RADIUS_SIGMAS = 3.33    # the box's half-extent in sigmas, at most
ALPHA_MAX = 0.999       # alpha = min(0.999, opacity exp(-sigma))
ALPHA_MIN = 1.0 / 255.0  # a smaller alpha is skipped
T_MIN = 1e-4            # a pixel stops before its transmittance would fall to this
FISHEYE_EPS = 1e-7      # gsplat's fisheye projection adds it to |(x, y)|, z and x^2
