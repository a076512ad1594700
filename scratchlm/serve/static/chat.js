// Tab 2, Chat: a conversation with a fine-tuned run. Each message is sent with the whole
// conversation so far to POST /api/chat, which renders it with the run's chat template and
// streams the reply as the Generate tab's events; the reply's tokens are shaded by probability
// as there (hover or focus one for its number). "Show the template" asks POST /api/chat/template
// for the conversation as one training row: the special tokens, and which tokens the
// fine-tuning loss learns.
"use strict";

const chat = { messages: [], running: false, abort: null, reply: null, stopped: false,
  templateAsked: 0, templateAnswers: 0 };
playground.chat = chat;  // tests read it

function chatStatus(state, text) {
  const status = $("#chat-status");
  status.dataset.state = state;
  status.textContent = text;
}

function setChatRunning(running) {
  chat.running = running;
  $("#chat-send").disabled = running;
  $("#chat-stop").disabled = !running;
  $("#chat-reset").disabled = running;
}

// One message in #chat-log; an assistant's text arrives token by token (addChatToken).
function chatBubble(role, text) {
  const body = el("div", { class: "msg-text" }, text);
  const bubble = el("div", { class: "msg " + role, "data-role": role }, el("span", { class: "msg-role" }, role), body);
  $("#chat-log").append(bubble);
  return body;
}

function addChatToken(token) {
  const span = tokenSpan(token, { tabindex: "0", title: `p = ${fmtPct(token.p)}` });
  chat.reply.tokens.push(token);
  chat.reply.text += token.text;
  chat.reply.node.append(span);
}

// The generation settings of the Generate tab, one reply at a time (no beams, no chosen tokens).
function chatRequest() {
  const settings = generateRequest();
  delete settings.prompt;
  settings.beams = 1;
  return { ...settings, messages: chat.messages.map((m) => ({ role: m.role, content: m.content })) };
}

async function sendChat() {
  const text = $("#chat-input").value;
  if (chat.running || !text.trim() || !playground.run) return;
  showError("chat-error", "");
  let body;
  try {
    chat.messages.push({ role: "user", content: text });
    body = chatRequest();
  } catch (err) {
    chat.messages.pop();
    return showError("chat-error", err.message);
  }
  $("#chat-input").value = "";
  chatBubble("user", text);
  chat.reply = { node: chatBubble("assistant", ""), tokens: [], text: "", done: false };
  chat.stopped = false;
  chat.abort = new AbortController();
  setChatRunning(true);
  chatStatus("running", "replying…");
  try {
    const response = await fetch("/api/chat", { ...postJSON(body), signal: chat.abort.signal });
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      throw serverError(data.error || `${response.status} ${response.statusText}`);
    }
    await readEvents(response.body.getReader(), onChatEvent);
    if (chat.reply && !chat.reply.done) {
      if (!chat.stopped) throw new Error("the connection ended before the reply was over");
      endReply("stopped", true);
    }
  } catch (err) {
    if (!chat.reply) {
      // the conversation was reset meanwhile (another run chosen): nothing left to keep or withdraw
    } else if (chat.stopped && !err.fromServer) {
      endReply("stopped", true);  // what Stop cut short (the abort, half an event) is not an error
    } else {
      withdraw(text, err instanceof TypeError ? lostServer(err, chat.reply.tokens.length) : err.message);
    }
  } finally {
    chat.abort = null;
    setChatRunning(false);
    if (!$("#chat-template").hidden) showTemplate();
  }
}

// An error the server sent (an error answer or event): shown even when Stop was pressed.
function serverError(message) {
  return Object.assign(new Error(message), { fromServer: true });
}

// An exchange with no whole reply is not part of the conversation: its bubbles go, and the
// message returns to the box to be sent again.
function withdraw(text, error) {
  chat.messages.pop();
  chat.reply.node.parentElement.remove();
  $("#chat-log").lastElementChild.remove();
  chat.reply = null;
  if (!$("#chat-input").value) {  // what the person typed meanwhile stays
    $("#chat-input").value = text;
    fontHint(text);
  }
  if (error) {
    showError("chat-error", error);
    chatStatus("error", "");
  }
}

function onChatEvent(name, data) {
  if (name === "start") {
    const dropped = data.dropped ? `; the ${data.dropped} oldest exchange(s) left out to fit the context` : "";
    chatStatus("running", `prompt: ${data.prompt_ids} tokens with the template${dropped}; replying…`);
  } else if (name === "token") {
    addChatToken(data);
  } else if (name === "done") {
    endReply({ eos: "ended at <|end|>", length: "stopped at the token limit",
      stopped: "ended early: the server is shutting down" }[data.reason] || data.reason, data.reason === "stopped");
    return true;
  } else if (name === "error") {
    throw serverError(data.message);
  }
  return false;
}

// The reply so far joins the conversation (a stopped one too, as `scratchlm chat` keeps it);
// stopped (by Stop, or by the server shutting down) before its first token, the exchange is
// withdrawn.
function endReply(why, early = false) {
  if (!chat.reply || chat.reply.done) return;
  if (early && !chat.reply.tokens.length) {
    withdraw(chat.messages[chat.messages.length - 1].content, "");
    return chatStatus("stopped", `${why} before the reply began`);
  }
  chat.reply.done = true;
  chat.messages.push({ role: "assistant", content: chat.reply.text });
  chatStatus("done", `${chat.reply.tokens.length} tokens, ${why}`);
}

function stopChat() {
  if (!chat.running) return;
  chat.stopped = true;
  chat.abort.abort();  // the request, or the answer's stream being read
}

function resetChat() {
  chat.messages = [];
  chat.templateAsked += 1;  // an answer still on its way is for the old conversation
  chat.reply = null;
  $("#chat-log").replaceChildren();
  $("#chat-template").replaceChildren();
  showError("chat-error", "");
  chatStatus("idle", "a new conversation");
}

// The conversation as `scratchlm sft` would train on it: every token, special ones marked, and
// those the loss learns underlined (the assistant's replies and their <|end|>, or with
// "every turn" the user's words too).
async function showTemplate() {
  const box = $("#chat-template");
  const asked = ++chat.templateAsked;  // answers may come back out of order: only the newest shows
  if (!chat.messages.length) {
    box.replaceChildren(el("p", { class: "note" }, "Send a message first: the template of the conversation shows here."));
    return;
  }
  let view;
  try {
    view = await fetchJSON("/api/chat/template", postJSON({ run: playground.run, messages: chat.messages,
      train_on: $("#chat-train-on").value }));
  } catch (err) {
    view = { error: err.message };
  }
  chat.templateAnswers += 1;
  if (asked !== chat.templateAsked) return;
  if (view.error) {
    box.replaceChildren();
    return showError("chat-error", view.error);
  }
  const row = el("div", { class: "template-row" });
  for (const t of view.tokens) {
    row.append(el("span", { class: "chip" + (t.special ? " special" : "") + (t.loss ? " loss" : ""),
      "data-id": t.id, title: `id ${t.id}${t.loss ? ", learned" : ""}` }, t.label));
  }
  box.replaceChildren(row, el("p", { class: "note" }, `${fmtInt(view.tokens.length)} tokens, ` +
    `${fmtInt(view.learned)} of them learned (underlined); the context holds ${fmtInt(view.block_size)}.`));
}

function wireChat() {
  $("#chat-send").addEventListener("click", sendChat);
  $("#chat-stop").addEventListener("click", stopChat);
  $("#chat-reset").addEventListener("click", resetChat);
  $("#chat-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {  // Shift+Enter: a new line
      event.preventDefault();
      sendChat();
    }
  });
  $("#chat-input").addEventListener("input", (event) => fontHint(event.target.value));
  const toggle = () => {
    $("#chat-template").hidden = !$("#chat-show-template").checked;
    if (!$("#chat-template").hidden) showTemplate();
  };
  $("#chat-show-template").addEventListener("change", toggle);
  $("#chat-train-on").addEventListener("change", toggle);
}
