// Composition: Seq<L...> (a flat type list, folded, never nested), Residual<S> (y = x + S(x)) and
// Repeat<N, Block> (one block type, N parameter sets, run in a loop), and the compile-time walks
// over any graph built from them and from storage policies. Names no concrete layer: what the
// graph needs to know of a layer is in its traits (layers/layer.hpp).
#pragma once

#include "repeat.hpp"
#include "residual.hpp"
#include "seq.hpp"
#include "walk.hpp"
