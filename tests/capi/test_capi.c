/* The C interface as a C program uses it (compiled as C11, -Wall -Wextra -pedantic -Werror): the
 * widths, the plan before anything is allocated and the allocator's measure after a step, training,
 * gradient accumulation, inference after reserve_inference, save and load, and every kind of bad
 * input refused with its status and message, the model unchanged bit for bit.
 *   test_capi <directory for files> */
#include "capi_surrogate.h"
#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                          \
    }                                                                      \
  } while (0)

#define STATUS(call, expected)                                                                            \
  do {                                                                                                    \
    int status_ = (call);                                                                                 \
    if (status_ != (expected)) {                                                                          \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__, #call, status_,    \
              (int)(expected), capi_surrogate_last_error());                                              \
      ++failures;                                                                                         \
    }                                                                                                     \
  } while (0)

enum { IN = 5, OUT = 5, BATCH = 32, PROBE = 7 };

static void fill(float* x, float* t, int64_t step, int64_t rows) {
  for (int64_t i = 0; i < rows * IN; ++i) x[i] = capi_input(step, i);
  for (int64_t i = 0; i < rows * OUT; ++i) t[i] = capi_target(step, i);
}

/* The model's output on a fixed probe batch. */
static void probe(capi_surrogate_model* m, float* y) {
  float x[PROBE * IN], t[PROBE * OUT];
  fill(x, t, 999, PROBE);
  STATUS(capi_surrogate_forward(m, x, PROBE, y), REMAT_OK);
}

static int same_output(capi_surrogate_model* a, capi_surrogate_model* b) {
  float ya[PROBE * OUT], yb[PROBE * OUT];
  probe(a, ya);
  probe(b, yb);
  return memcmp(ya, yb, sizeof ya) == 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_capi <directory for files>\n");
    return 2;
  }
  char model_file[4096], optimizer_file[4096];
  snprintf(model_file, sizeof model_file, "%s/capi_model.safetensors", argv[1]);
  snprintf(optimizer_file, sizeof optimizer_file, "%s/capi_optimizer.safetensors", argv[1]);

  CHECK(capi_surrogate_in_features() == IN);
  CHECK(capi_surrogate_out_features() == OUT);

  /* The plan, before any model exists. */
  remat_options options = capi_surrogate_default_options();
  CHECK(options.learning_rate == 1e-3 && options.beta1 == 0.9 && options.beta2 == 0.999);
  options.seed = 3;
  options.learning_rate = 1e-2;
  remat_memory_plan plan;
  STATUS(capi_surrogate_memory_plan(&options, BATCH, &plan), REMAT_OK);
  /* Weights: 5*64 + 64 + 64*64 + 64 + 64*5 + 5 = 4,869 floats, 19,476 bytes, rounded to 256: 19,712. */
  CHECK(plan.parameters == 19712);
  CHECK(plan.gradients == 19712);
  CHECK(plan.optimizer_state == 2 * 19712);
  CHECK(plan.activations > 0 && plan.step_peak == plan.parameters + plan.gradients + plan.optimizer_state +
                                                      plan.activations + plan.workspace);
  CHECK(plan.inference_arena > 0);
  STATUS(capi_surrogate_memory_plan(&options, 0, &plan), REMAT_ERROR_ARGUMENT);
  STATUS(capi_surrogate_memory_plan(&options, BATCH, NULL), REMAT_ERROR_ARGUMENT);

  capi_surrogate_model* m = NULL;
  STATUS(capi_surrogate_create(&m, &options), REMAT_OK);
  CHECK(m != NULL);
  STATUS(capi_surrogate_create(NULL, &options), REMAT_ERROR_ARGUMENT);
  CHECK(strstr(capi_surrogate_last_error(), "NULL") != NULL);
  {
    /* A setting outside torch.optim's range: no model, the setting named. */
    remat_options bad = options;
    capi_surrogate_model* none = NULL;
    bad.beta2 = 1.0;
    STATUS(capi_surrogate_create(&none, &bad), REMAT_ERROR_ARGUMENT);
    CHECK(none == NULL);
    CHECK(strstr(capi_surrogate_last_error(), "expected beta2 in [0, 1), found 1") != NULL);
  }

  /* Training: the loss falls. */
  float x[BATCH * IN], t[BATCH * OUT];
  double first = 0, loss = 0;
  for (int step = 0; step < 200; ++step) {
    fill(x, t, step % 4, BATCH);
    STATUS(capi_surrogate_train_step(m, x, t, BATCH, &loss), REMAT_OK);
    if (step == 0) first = loss;
  }
  CHECK(capi_surrogate_last_error()[0] == '\0');
  if (!(isfinite(loss) && loss < 0.5 * first)) fprintf(stderr, "loss %g from %g\n", loss, first);
  CHECK(isfinite(loss) && loss < 0.5 * first);

  /* What the model's allocator measured equals the plan. */
  remat_memory_plan measured;
  STATUS(capi_surrogate_memory_plan(&options, BATCH, &plan), REMAT_OK);
  STATUS(capi_surrogate_memory_measured(m, &measured), REMAT_OK);
  CHECK(measured.parameters == plan.parameters);
  CHECK(measured.gradients == plan.gradients);
  CHECK(measured.optimizer_state == plan.optimizer_state);
  CHECK(measured.activations == plan.activations);
  CHECK(measured.workspace == plan.workspace);
  CHECK(measured.step_peak == plan.step_peak);
  CHECK(measured.step_reserved == plan.step_reserved);

  /* Bad input: refused with its kind and message, the model as it was. */
  float before[PROBE * OUT], after[PROBE * OUT];
  probe(m, before);
  STATUS(capi_surrogate_train_step(m, x, t, 0, &loss), REMAT_ERROR_ARGUMENT);
  CHECK(strstr(capi_surrogate_last_error(), "batch") != NULL);
  STATUS(capi_surrogate_train_step(m, NULL, t, BATCH, &loss), REMAT_ERROR_ARGUMENT);
  STATUS(capi_surrogate_train_step(NULL, x, t, BATCH, &loss), REMAT_ERROR_ARGUMENT);
  t[3] = NAN;
  STATUS(capi_surrogate_train_step(m, x, t, BATCH, &loss), REMAT_ERROR_ARGUMENT);
  CHECK(strstr(capi_surrogate_last_error(), "finite") != NULL);
  t[3] = 0;
  STATUS(capi_surrogate_set_learning_rate(m, -1), REMAT_ERROR_ARGUMENT);
  CHECK(strstr(capi_surrogate_last_error(), "expected lr finite and >= 0, found -1") != NULL);
  STATUS(capi_surrogate_accumulate(m, x, t, BATCH, NAN, &loss), REMAT_ERROR_ARGUMENT);
  CHECK(strstr(capi_surrogate_last_error(), "expected a finite weight") != NULL);
  STATUS(capi_surrogate_load(m, "/nonexistent/remat.safetensors", NULL), REMAT_ERROR_IO);
  probe(m, after);
  CHECK(memcmp(before, after, sizeof before) == 0);

  /* One micro-batch of weight 1 accumulated, then a step: a train step, bit for bit. */
  capi_surrogate_model* twin = NULL;
  STATUS(capi_surrogate_save(m, model_file, optimizer_file), REMAT_OK);
  STATUS(capi_surrogate_create(&twin, &options), REMAT_OK);
  STATUS(capi_surrogate_load(twin, model_file, optimizer_file), REMAT_OK);
  CHECK(same_output(m, twin));
  fill(x, t, 7, BATCH);
  double l1 = 0, l2 = 0;
  STATUS(capi_surrogate_train_step(m, x, t, BATCH, &l1), REMAT_OK);
  STATUS(capi_surrogate_zero_grad(twin), REMAT_OK);
  STATUS(capi_surrogate_accumulate(twin, x, t, BATCH, 1.0, &l2), REMAT_OK);
  STATUS(capi_surrogate_step(twin), REMAT_OK);
  CHECK(l1 == l2);
  CHECK(same_output(m, twin));

  /* Restart: a model loaded from the files continues as the one that wrote them, bit for bit. */
  capi_surrogate_model* restarted = NULL;
  remat_options other = options;
  other.seed = 99;
  STATUS(capi_surrogate_save(m, model_file, optimizer_file), REMAT_OK);
  STATUS(capi_surrogate_create(&restarted, &other), REMAT_OK);
  CHECK(!same_output(m, restarted));
  /* A file that is not this model's (the optimizer's as the model's) changes nothing. */
  probe(restarted, before);
  STATUS(capi_surrogate_load(restarted, optimizer_file, NULL), REMAT_ERROR_IO);
  probe(restarted, after);
  CHECK(memcmp(before, after, sizeof before) == 0);
  STATUS(capi_surrogate_load(restarted, model_file, optimizer_file), REMAT_OK);
  for (int step = 0; step < 3; ++step) {
    fill(x, t, step, BATCH);
    STATUS(capi_surrogate_train_step(m, x, t, BATCH, &l1), REMAT_OK);
    STATUS(capi_surrogate_train_step(restarted, x, t, BATCH, &l2), REMAT_OK);
    CHECK(l1 == l2);
  }
  CHECK(same_output(m, restarted));

  /* Inference after reserve_inference: up to the batch reserved, a larger one refused. */
  float big_x[64 * IN], big_t[64 * OUT], y[65 * OUT];
  fill(big_x, big_t, 1, 64);
  STATUS(capi_surrogate_reserve_inference(m, 64), REMAT_OK);
  STATUS(capi_surrogate_forward(m, big_x, 64, y), REMAT_OK);
  float x65[65 * IN];
  memset(x65, 0, sizeof x65);
  STATUS(capi_surrogate_forward(m, x65, 65, y), REMAT_ERROR_SHAPE);
  STATUS(capi_surrogate_forward(m, big_x, 64, NULL), REMAT_ERROR_ARGUMENT);

  capi_surrogate_destroy(restarted);
  capi_surrogate_destroy(twin);
  capi_surrogate_destroy(m);
  capi_surrogate_destroy(NULL);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("the C interface: every check passed (loss %.6f after 200 steps, from %.6f)\n", loss, first);
  return 0;
}
