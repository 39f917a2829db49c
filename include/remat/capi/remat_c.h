/* What every remat model library's C interface shares: status codes, options and the memory plan.
 * C11 and C++; a library made by remat_add_model_library (CMake) or REMAT_EXPORT_C_MODEL
 * (remat/capi/export.hpp) declares its functions, prefixed with its name, in a header of its own
 * that includes this one. docs/c-and-fortran.md is the guide. */
#ifndef REMAT_CAPI_REMAT_C_H
#define REMAT_CAPI_REMAT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a call returns: REMAT_OK, or the kind of remat::error it caught (the message:
 * <name>_last_error()). A failed call changes nothing: the model and optimizer are as before. */
typedef enum remat_status {
  REMAT_OK = 0,
  REMAT_ERROR_ARGUMENT = 1,    /* an argument out of range: a null pointer, a batch of 0, a bad option */
  REMAT_ERROR_SHAPE = 2,       /* an input whose shape the model does not take */
  REMAT_ERROR_MEMORY = 3,      /* out of memory (host or device) */
  REMAT_ERROR_IO = 4,          /* a file that cannot be read or written, or is not this model's */
  REMAT_ERROR_DEVICE = 5,      /* a CUDA call failed */
  REMAT_ERROR_DISTRIBUTED = 6, /* another rank failed, or the communicator did */
  REMAT_ERROR_OTHER = 7        /* anything else (a non-finite loss, an internal error) */
} remat_status;

/* The optimizer's settings and the initial weights' seed. remat_default_options() gives remat's
 * defaults (AdamW: lr 1e-3, betas 0.9 and 0.999, eps 1e-8, weight decay 0.01; SGD: lr 1e-2). */
typedef struct remat_options {
  uint64_t seed;         /* the initial weights' seed */
  double learning_rate;  /* lr */
  double beta1;          /* AdamW's first-moment decay */
  double beta2;          /* AdamW's second-moment decay */
  double eps;            /* AdamW's epsilon */
  double weight_decay;   /* decoupled (AdamW) or added to the gradient (SGD) */
  double momentum;       /* SGD's momentum (0: none) */
} remat_options;

/* A model's memory before anything is allocated, in bytes, as the model's allocator measures it
 * (each block rounded to 256 bytes): a training step of `batch` rows, and inference of up to
 * `batch` rows (what the library's reserve_inference holds). */
typedef struct remat_memory_plan {
  uint64_t parameters;       /* weights (and a 16-bit compute copy in mixed precision, and running state) */
  uint64_t gradients;        /* one per parameter, in the master type */
  uint64_t optimizer_state;  /* AdamW: two moments; SGD: a momentum buffer or none */
  uint64_t activations;      /* the training step's activations at their peak */
  uint64_t workspace;        /* the loss's workspace at its peak */
  uint64_t step_peak;        /* all of it in use at the training step's peak */
  uint64_t step_reserved;    /* what the model's allocator reserves for training: persistent + arena */
  uint64_t inference_arena;  /* what inference of up to `batch` rows reserves */
} remat_memory_plan;

#ifdef __cplusplus
}
#endif

#endif /* REMAT_CAPI_REMAT_C_H */
