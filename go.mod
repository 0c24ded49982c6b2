module github.com/statecast/statecast

go 1.26
