/* A C app running an exported folder through onnxruntime-genai's own C API, as apps in C (and, through
 * genai's bindings, C++, C# and Java) would: model, tokenizer, generator. Built and run by
 * tests/export/test_genai_runs_the_export.py against the genai wheel's library:
 *
 *     genai_c_app FOLDER PROMPT MAX_LENGTH   -> the generated token ids on one line, then their text
 *
 * genai's header is not in its wheel, so the few entry points used are declared here, as the genai C
 * API (ort_genai_c.h) defines them. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct OgaResult OgaResult;
typedef struct OgaModel OgaModel;
typedef struct OgaTokenizer OgaTokenizer;
typedef struct OgaSequences OgaSequences;
typedef struct OgaGeneratorParams OgaGeneratorParams;
typedef struct OgaGenerator OgaGenerator;

const char* OgaResultGetError(const OgaResult* result);
void OgaDestroyResult(OgaResult* result);
void OgaDestroyString(const char* string);
OgaResult* OgaCreateModel(const char* config_path, OgaModel** out);
void OgaDestroyModel(OgaModel* model);
OgaResult* OgaCreateTokenizer(const OgaModel* model, OgaTokenizer** out);
void OgaDestroyTokenizer(OgaTokenizer* tokenizer);
OgaResult* OgaCreateSequences(OgaSequences** out);
void OgaDestroySequences(OgaSequences* sequences);
size_t OgaSequencesGetSequenceCount(const OgaSequences* sequences, size_t index);
OgaResult* OgaTokenizerEncode(const OgaTokenizer* tokenizer, const char* text, OgaSequences* sequences);
OgaResult* OgaTokenizerDecode(const OgaTokenizer* tokenizer, const int32_t* tokens, size_t count, const char** out);
OgaResult* OgaCreateGeneratorParams(const OgaModel* model, OgaGeneratorParams** out);
void OgaDestroyGeneratorParams(OgaGeneratorParams* params);
OgaResult* OgaGeneratorParamsSetSearchNumber(OgaGeneratorParams* params, const char* name, double value);
OgaResult* OgaCreateGenerator(const OgaModel* model, const OgaGeneratorParams* params, OgaGenerator** out);
void OgaDestroyGenerator(OgaGenerator* generator);
OgaResult* OgaGenerator_AppendTokenSequences(OgaGenerator* generator, const OgaSequences* sequences);
bool OgaGenerator_IsDone(const OgaGenerator* generator);
OgaResult* OgaGenerator_GenerateNextToken(OgaGenerator* generator);
size_t OgaGenerator_GetSequenceCount(const OgaGenerator* generator, size_t index);
const int32_t* OgaGenerator_GetSequenceData(const OgaGenerator* generator, size_t index);

/* Every call's result checked: a failure prints genai's message and ends the app. */
static void check(OgaResult* result, const char* what) {
  if (result == NULL) return;
  fprintf(stderr, "%s: %s\n", what, OgaResultGetError(result));
  OgaDestroyResult(result);
  exit(1);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s FOLDER PROMPT MAX_LENGTH\n", argv[0]);
    return 2;
  }
  OgaModel* model = NULL;
  OgaTokenizer* tokenizer = NULL;
  OgaSequences* prompt = NULL;
  OgaGeneratorParams* params = NULL;
  OgaGenerator* generator = NULL;
  check(OgaCreateModel(argv[1], &model), "OgaCreateModel");
  check(OgaCreateTokenizer(model, &tokenizer), "OgaCreateTokenizer");
  check(OgaCreateSequences(&prompt), "OgaCreateSequences");
  check(OgaTokenizerEncode(tokenizer, argv[2], prompt), "OgaTokenizerEncode");
  const size_t prompt_tokens = OgaSequencesGetSequenceCount(prompt, 0);
  check(OgaCreateGeneratorParams(model, &params), "OgaCreateGeneratorParams");
  check(OgaGeneratorParamsSetSearchNumber(params, "max_length", atof(argv[3])), "max_length");
  check(OgaCreateGenerator(model, params, &generator), "OgaCreateGenerator");
  check(OgaGenerator_AppendTokenSequences(generator, prompt), "AppendTokenSequences");
  while (!OgaGenerator_IsDone(generator)) check(OgaGenerator_GenerateNextToken(generator), "GenerateNextToken");
  const size_t count = OgaGenerator_GetSequenceCount(generator, 0);
  const int32_t* tokens = OgaGenerator_GetSequenceData(generator, 0);
  for (size_t i = prompt_tokens; i < count; ++i) printf(i + 1 < count ? "%d " : "%d", tokens[i]);
  const char* text = NULL;
  check(OgaTokenizerDecode(tokenizer, tokens + prompt_tokens, count - prompt_tokens, &text), "OgaTokenizerDecode");
  printf("\n%s\n", text);
  OgaDestroyString(text);
  OgaDestroyGenerator(generator);
  OgaDestroyGeneratorParams(params);
  OgaDestroySequences(prompt);
  OgaDestroyTokenizer(tokenizer);
  OgaDestroyModel(model);
  return 0;
}
