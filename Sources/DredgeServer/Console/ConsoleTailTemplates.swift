/// The console's live-tail pages (#53): the list, the form, and the live view, with the live
/// view's script (served in `console.js`, after the others).
extension ConsoleTemplates {
    static let tails = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Live</h1>
        {{#mayPull}}<p><a class="button" href="/console/tails/new">Watch a user live</a></p>{{/mayPull}}
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">Tail</th><th scope="col">Started</th><th scope="col">By</th><th scope="col">User</th><th scope="col">Reason</th><th scope="col">Seen</th><th scope="col">Where it stands</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td data-label="Tail"><a href="/console/tails/{{id}}"><code>{{shortID}}</code></a></td><td data-label="Started" class="nowrap">{{startedAt}}</td><td data-label="By">{{by}}</td><td data-label="User">{{uid}}</td><td data-label="Reason" class="wrap">{{reason}}</td><td data-label="Seen" class="wrap">{{seen}}</td><td data-label="Where it stands">{{#open}}<span class="status running">{{state}}</span>{{/open}}{{^open}}{{state}}{{/open}}</td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="7">No live tail yet.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        <p class="hint">A tail shows what a user's devices log from the moment it starts, for up to an hour; what it showed is kept and searched with the rest.</p>
        {{/content}}
        {{/layout}}
        """

    static let newTail = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Watch live</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <form class="pull tail" method="post" action="/console/tails">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="uid">User id</label>
        <input id="uid" name="uid" value="{{uid}}" autocomplete="off" required>
        <label for="agent">Device</label>
        <select id="agent" name="agent">
        <option value="">every device that holds the user, those that come online too</option>
        {{#agents}}<option value="{{id}}"{{#selected}} selected{{/selected}}>{{label}}</option>{{/agents}}
        </select>
        <label for="host">Host</label>
        <input id="host" name="host" value="{{host}}" autocomplete="off" placeholder="any">
        <label for="level">Levels</label>
        <input id="level" name="level" value="{{level}}" placeholder="e.g. warning+ (empty: all)">
        <label for="type">Types</label>
        <input id="type" name="type" value="{{type}}" placeholder="e.g. app, network (empty: all)">
        <label for="text">Contains</label>
        <input id="text" name="text" value="{{text}}" placeholder="any (a substring of the message or metadata)">
        <label for="minutes">For (minutes)</label>
        <input id="minutes" name="minutes" value="{{minutes}}" inputmode="numeric" size="4">
        <label class="check"><input type="checkbox" name="verbose"{{#verbose}} checked{{/verbose}}> Also keep the user's debug and trace records while it runs</label>
        <label class="check"><input type="checkbox" name="urgent"{{#urgent}} checked{{/urgent}}> Urgent: devices whose upload policy allows it run it also on a metered network</label>
        <label for="reason">Reason</label>
        <input id="reason" name="reason" value="{{reason}}" maxlength="256" placeholder="e.g. SUP-1234 (in the audit log)">
        <button type="submit">Start watching</button>
        </form>
        <p class="hint">The devices send the matching records they log from now on, at most 200 a second each; a device that comes online or starts holding the user joins. The tail ends when you stop it, at its end, or when you sign out; each device ends its part by itself at the end even if it no longer hears the server.</p>
        {{/content}}
        {{/layout}}
        """

    static let tail = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Live: {{uid}} <span id="tail-state" class="status{{#open}} running{{/open}}">{{state}}</span></h1>
        <dl class="facts">
        <dt>Records</dt><dd>{{filter}}</dd>
        {{#verbose}}<dt>Verbose</dt><dd>{{verbose}}</dd>{{/verbose}}
        <dt>Started by</dt><dd>{{by}}, {{startedAt}}</dd>
        {{#reason}}<dt>Reason</dt><dd>{{reason}}</dd>{{/reason}}
        <dt>Ends</dt><dd>{{expiresAt}}</dd>
        <dt>Tail</dt><dd><code>{{id}}</code></dd>
        </dl>
        <div class="table-wrap">
        <table class="cards devices" id="devices">
        <thead><tr><th scope="col">Device</th><th scope="col">Status</th><th scope="col">Records</th><th scope="col">Left out</th><th scope="col">Detail</th></tr></thead>
        <tbody>
        {{#devices}}
        <tr data-agent="{{agentID}}"><td data-label="Device">{{host}} <code title="{{agentID}}">{{shortID}}</code></td><td data-label="Status"><span class="status {{status}}">{{status}}</span></td><td data-label="Records" class="records">{{records}}</td><td data-label="Left out" class="dropped">{{dropped}}</td><td data-label="Detail" class="detail">{{detail}}</td></tr>
        {{/devices}}
        {{^devices}}<tr class="none"><td colspan="5">No device holds the user yet: the tail waits for one until it ends.</td></tr>{{/devices}}
        </tbody>
        </table>
        </div>
        <div class="links">{{#events}}<button type="button" id="pause" hidden aria-pressed="false">Pause</button> {{/events}}{{#mayStop}}<form class="inline" method="post" action="/console/tails/{{id}}/stop"><input type="hidden" name="csrf" value="{{csrf}}"><button type="submit" id="stop">Stop</button></form> {{/mayStop}}<a href="{{logs}}">Search what it showed</a> {{#files}}<a href="{{files}}">Download what it held</a> {{/files}}<a href="/console/tails">All tails</a></div>
        <p class="hint" id="live" role="status">{{#events}}Watching: records are added below as the devices log them.{{/events}}{{^events}}{{#open}}Only {{by}} or an admin watches this tail.{{/open}}{{^open}}This tail is over; what it showed is searched with the rest.{{/open}}{{/events}}</p>
        <div class="table-wrap">
        <table class="logs cards" id="live-records"{{#events}} data-tail-events="{{events}}"{{/events}}>
        <thead><tr><th scope="col">Time</th><th scope="col">Host</th><th scope="col">App</th><th scope="col">Level</th><th scope="col">Type</th><th scope="col">User</th><th scope="col">Message</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr class="level-{{level}}"><td data-label="Time" class="nowrap">{{time}}</td><td data-label="Host">{{host}}</td><td data-label="App">{{app}}</td><td data-label="Level" class="level">{{level}}</td><td data-label="Type">{{type}}</td><td data-label="User">{{uid}}</td><td data-label="Message" class="message">{{message}}{{#metadata}}<br><small>{{metadata}}</small>{{/metadata}}</td></tr>
        {{/rows}}
        </tbody>
        </table>
        </div>
        {{#earlier}}<p class="hint">{{earlier}}</p>{{/earlier}}
        {{/content}}
        {{/layout}}
        """

    /// The live view: rows added as text as events arrive (never parsed as markup), the newest
    /// ``most`` kept on the page; Pause holds what arrives (up to as many) until Resume; the
    /// devices' table follows their states; `end` says why and stops.
    static let liveScript = """

        // The live view of a tail (#53).
        (function () {
          var table = document.querySelector("table[data-tail-events]");
          if (!table || !window.EventSource) { return; }
          var body = table.querySelector("tbody"), said = document.getElementById("live"), pause = document.getElementById("pause");
          var devices = document.querySelector("#devices tbody"), state = document.getElementById("tail-state");
          var most = 5000, shown = 0, held = [], heldOver = 0, paused = false, notes = [];
          var cell = function (text, name, label) {
            var td = document.createElement("td");
            if (name) { td.className = name; }
            if (label) { td.setAttribute("data-label", label); }
            td.textContent = text;
            return td;
          };
          var row = function (r) {
            var tr = document.createElement("tr");
            tr.className = "level-" + r.level + " arrived";
            var message = cell(r.message, "message", "Message");
            if (r.metadata) {
              var small = document.createElement("small");
              small.textContent = r.metadata;
              message.appendChild(document.createElement("br"));
              message.appendChild(small);
            }
            [cell(r.time, "nowrap", "Time"), cell(r.host, "", "Host"), cell(r.app, "", "App"), cell(r.level, "level", "Level"), cell(r.type, "", "Type"), cell(r.uid, "", "User"), message].forEach(function (td) { tr.appendChild(td); });
            return tr;
          };
          var tell = function () {
            var text = paused
              ? "Paused: " + held.length + (heldOver ? " (and " + heldOver + " more, not kept on the page)" : "") + " new record(s) wait."
              : "Watching: " + shown + " record(s) arrived.";
            said.textContent = notes.length ? text + " " + notes.join(" ") : text;
          };
          var add = function (records) {
            var atBottom = window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 4;
            for (var i = 0; i < records.length; i++) { body.appendChild(row(records[i])); }
            shown += records.length;
            while (body.rows.length > most) { body.deleteRow(0); }
            if (atBottom && body.lastElementChild) { body.lastElementChild.scrollIntoView({ block: "end" }); }
          };
          var stream = new EventSource(table.getAttribute("data-tail-events"));
          if (pause) {
            pause.hidden = false;
            pause.addEventListener("click", function () {
              paused = !paused;
              pause.textContent = paused ? "Resume" : "Pause";
              pause.setAttribute("aria-pressed", paused ? "true" : "false");
              if (!paused) {
                add(held);
                if (heldOver) { notes.push(heldOver + " record(s) that arrived while paused are not shown: search them."); }
                held = [];
                heldOver = 0;
              }
              tell();
            });
          }
          stream.onmessage = function (event) {
            var records = JSON.parse(event.data);
            if (paused) {
              for (var i = 0; i < records.length; i++) { if (held.length < most) { held.push(records[i]); } else { heldOver++; } }
            } else {
              add(records);
            }
            tell();
          };
          stream.addEventListener("devices", function (event) {
            var list = JSON.parse(event.data);
            for (var i = 0; i < list.length; i++) {
              var d = list[i];
              if (!/^[0-9a-f]{32}$/.test(d.agentID)) { continue; }
              var tr = devices.querySelector('tr[data-agent="' + d.agentID + '"]');
              if (!tr) {
                var none = devices.querySelector("tr.none");
                if (none) { none.remove(); }
                tr = document.createElement("tr");
                tr.setAttribute("data-agent", d.agentID);
                var name = cell(d.host + " ", "", "Device"), code = document.createElement("code");
                code.textContent = d.agentID.slice(0, 8);
                code.title = d.agentID;
                name.appendChild(code);
                var status = cell("", "", "Status"), badge = document.createElement("span");
                status.appendChild(badge);
                [name, status, cell("", "records", "Records"), cell("", "dropped", "Left out"), cell("", "detail", "Detail")].forEach(function (td) { tr.appendChild(td); });
                devices.appendChild(tr);
              }
              var span = tr.querySelector("span");
              span.textContent = d.status;
              span.className = "status " + d.status;
              tr.querySelector(".records").textContent = d.records;
              tr.querySelector(".dropped").textContent = d.dropped;
              tr.querySelector(".detail").textContent = d.detail;
            }
          });
          var note = function (event, text) {
            var gap = JSON.parse(event.data);
            notes.push(gap.host + text.replace("N", gap.count));
            if (notes.length > 5) { notes.shift(); }
            tell();
          };
          stream.addEventListener("dropped", function (event) { note(event, " left out N record(s) over the tail's rate."); });
          stream.addEventListener("missed", function (event) { note(event, ": this page fell behind and skipped N record(s) (they are kept)."); });
          stream.addEventListener("end", function (event) {
            stream.close();
            if (paused && pause) { pause.click(); }
            if (pause) { pause.hidden = true; }
            var stop = document.getElementById("stop");
            if (stop) { stop.disabled = true; }
            state.textContent = "ended";
            state.className = "status ended";
            said.textContent = "Ended: " + JSON.parse(event.data).reason + ". " + shown + " record(s) arrived.";
          });
          stream.onerror = function () {
            if (stream.readyState === EventSource.CLOSED) { said.textContent = "Not watching any more: reload the page."; }
          };
        })();
        """
}
