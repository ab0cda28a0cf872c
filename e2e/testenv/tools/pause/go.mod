// The real node's sandbox image (main.go); standard library only.
module pullman.dev/e2e/testenv/tools/pause

go 1.26.0
