// The per-context conditioning a model announces in `hello` (docs/protocol.md): a LoRA adapter
// (`hello.loras.loaded`), an instruction (`hello.model.instruction`) and a language
// (`hello.model.languages`). Each control shows only when the server offers it, and a field is
// sent in `context.create` only when set, so a plain VoxCPM session sends exactly what it always did.

import * as ui from "./ui.js";

const { $ } = ui;

// The server's limit on an instruction (wsserver/messages.py MAX_INSTRUCTION_CHARS).
const MAX_INSTRUCTION_CHARS = 1000;

/** Fill and show or hide the controls for a new session's `hello`, keeping choices it still allows. */
export function fillConditioning(hello) {
  const adapters = hello.loras?.loaded ?? [];
  fillChoice("lora", adapters, (name) => name);
  // "auto" is what an empty field means already (the model decides), so it is the default option, not a second one.
  const languages = (hello.model?.languages ?? []).filter((l) => l.toLowerCase() !== "auto");
  fillChoice("language", languages, (l) => l.charAt(0).toUpperCase() + l.slice(1));
  const instruction = Boolean(hello.model?.instruction);
  $("instruction").maxLength = MAX_INSTRUCTION_CHARS;
  $("instruction-field").hidden = !instruction;
  $("conditioning").hidden = !instruction && adapters.length === 0 && languages.length === 0;
}

/** The fields for `context.create`: only those set, and only those the server offered. */
export function conditioningSettings() {
  const settings = {};
  if (!$("lora-field").hidden && $("lora").value) settings.lora = $("lora").value;
  if (!$("instruction-field").hidden && $("instruction").value.trim()) settings.instruction = $("instruction").value;
  if (!$("language-field").hidden && $("language").value) settings.language = $("language").value;
  return settings;
}

export function setConditioningEnabled(enabled) {
  for (const id of ["lora", "instruction", "language"]) $(id).disabled = !enabled;
}

function fillChoice(id, values, label) {
  const select = $(id);
  const previous = select.value;
  ui.fillSelect(select, ["", ...values], {
    label: (v) => (v === "" ? select.dataset.none : label(v)),
    selected: values.includes(previous) ? previous : "",
  });
  $(`${id}-field`).hidden = values.length === 0;
}
