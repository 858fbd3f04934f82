// kiln::kiln_compiled: the backend's entry points (backend/entry.hpp) compiled once, so that
// translation units built with KILN_COMPILED_LIBRARY parse only the front end. Everything here
// is the header-only library's own code; this file only decides where it is compiled.
#ifndef KILN_COMPILED_LIBRARY
#error "kiln_compiled.cpp is built with KILN_COMPILED_LIBRARY defined (the kiln::kiln_compiled target does that)"
#endif
#include "kiln/backend/entry_impl.hpp"
#include "kiln/ir/graph_impl.hpp"
#include "kiln/runtime/host_allocator_impl.hpp"
// The front end's non-template definitions that compiled mode keeps out of users' translation
// units (each *_impl.hpp beside the header that declares them), after the whole public API.
#include "kiln/kiln.hpp"
#include "kiln/nn/module_impl.hpp"
#include "kiln/nn/ddp_impl.hpp"
#include "kiln/distributed/distributed_impl.hpp"
#include "kiln/nn/safetensors_impl.hpp"
#include "kiln/optim/optimizer_impl.hpp"
#include "kiln/optim/adam_impl.hpp"
#include "kiln/optim/sgd_impl.hpp"
#include "kiln/optim/lr_scheduler_impl.hpp"
#include "kiln/optim/grad_scaler_impl.hpp"
#include "kiln/optim/clip_grad_impl.hpp"
#include "kiln/nn/functional_impl.hpp"
#include "kiln/nn/layers_impl.hpp"
#include "kiln/tensor/creation_impl.hpp"
#include "kiln/tensor/eval_impl.hpp"
#include "kiln/tensor/indexing_impl.hpp"
#include "kiln/tensor/autograd_impl.hpp"
#include "kiln/tensor/autocast_impl.hpp"
#include "kiln/tensor/linalg_impl.hpp"
#include "kiln/tensor/losses_impl.hpp"
#include "kiln/tensor/print_impl.hpp"
#include "kiln/tensor/scans_impl.hpp"
#include "kiln/tensor/shape_ops_impl.hpp"
#include "kiln/tensor/sorting_impl.hpp"
#include "kiln/tensor/functions_impl.hpp"
#include "kiln/compile/backward_graph_impl.hpp"
#include "kiln/compile/compile_impl.hpp"
#include "kiln/compile/symbolic_impl.hpp"
