// Deprecated: the data-parallel headers moved to remat/parallel/ after remat 0.2 (a folder named
// dist/ is build output to many tools and .gitignore templates). Include <remat/parallel/mpi.hpp>;
// this forwarding header is kept for one minor version. The namespace stays remat::dist.
#pragma once

#include "../parallel/mpi.hpp"
