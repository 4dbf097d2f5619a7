from tbcoll.launch.command import main

main()
