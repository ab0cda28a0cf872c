// Command health judges one Kubernetes object, read as JSON on stdin, the way GitOps tools do,
// and prints the verdict as JSON on stdout:
//
//	health kstatus          {"status":"InProgress|Current|Failed|Terminating|...","message":"..."}
//	health lua SCRIPT.lua   {"status":"Progressing|Healthy|Degraded|...","message":"..."}
//	health flux EXPRS.json  {"status":"InProgress|Current|Failed","message":""}
//
// kstatus is sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute, the library behind Flux health
// checks and Helm 4 --wait. The lua mode runs an Argo CD resource health script in gopher-lua
// (Lua 5.1), as Argo CD does: the object is the global `obj`, the script returns a table with
// `status` and `message`. The flux mode evaluates a Flux Kustomization `healthCheckExprs` entry
// (a JSON object with current, failed and inProgress) with Flux's own evaluator
// (github.com/fluxcd/pkg/runtime/cel). Exit status 2 means the helper itself could not judge the object.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"context"

	"github.com/fluxcd/pkg/apis/kustomize"
	fluxcel "github.com/fluxcd/pkg/runtime/cel"
	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: health kstatus | health lua SCRIPT.lua  (object JSON on stdin)")
	}
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	var obj map[string]interface{}
	if err := json.Unmarshal(raw, &obj); err != nil {
		fail("stdin is not a JSON object: %v", err)
	}
	var v verdict
	switch os.Args[1] {
	case "kstatus":
		// Decoded again the way client-go does it (integers stay int64), as kstatus expects.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			fail("stdin is not a Kubernetes object: %v", err)
		}
		res, err := status.Compute(u)
		if err != nil {
			fail("kstatus: %v", err)
		}
		v = verdict{Status: res.Status.String(), Message: res.Message}
	case "lua":
		if len(os.Args) != 3 {
			fail("usage: health lua SCRIPT.lua")
		}
		v = runLua(os.Args[2], obj)
	case "flux":
		if len(os.Args) != 3 {
			fail("usage: health flux EXPRS.json")
		}
		v = runFlux(os.Args[2], raw)
	default:
		fail("unknown mode %q", os.Args[1])
	}
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
}

func runFlux(exprsFile string, raw []byte) verdict {
	text, err := os.ReadFile(exprsFile)
	if err != nil {
		fail("reading %s: %v", exprsFile, err)
	}
	var exprs kustomize.HealthCheckExpressions
	if err := json.Unmarshal(text, &exprs); err != nil {
		fail("%s: %v", exprsFile, err)
	}
	eval, err := fluxcel.NewStatusEvaluator(&exprs)
	if err != nil {
		fail("flux: %v", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		fail("stdin is not a Kubernetes object: %v", err)
	}
	res, err := eval.Evaluate(context.Background(), u)
	if err != nil {
		// Flux keeps polling on an evaluation error; report it as a verdict the tests can see.
		return verdict{Status: "Error", Message: err.Error()}
	}
	return verdict{Status: res.Status.String(), Message: res.Message}
}

func runLua(script string, obj map[string]interface{}) verdict {
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoFile(script); err != nil {
		fail("running %s: %v", script, err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		fail("%s returned %s, not a table", script, L.Get(-1).Type())
	}
	str := func(key string) string {
		if s, ok := ret.RawGetString(key).(lua.LString); ok {
			return string(s)
		}
		return ""
	}
	return verdict{Status: str("status"), Message: str("message")}
}

// toLua converts decoded JSON to Lua values: objects to tables with string keys, arrays to
// tables indexed from 1, null to nil.
func toLua(L *lua.LState, v interface{}) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case float64:
		return lua.LNumber(x)
	case string:
		return lua.LString(x)
	case []interface{}:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	case map[string]interface{}:
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	default:
		fail("unexpected JSON value %T", v)
		return lua.LNil
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "health: "+format+"\n", args...)
	os.Exit(2)
}
